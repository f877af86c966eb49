"""A projection against a weight that stays quantized (`kernels.QuantizedWeight`, rows layout) on GPU: each
program dequantizes its [BLOCK_K, BLOCK_N] tiles of the weight in registers, codes to values (integers offset
by 2**(bits - 1), or FP8 e4m3 / FP4 e2m1 bit patterns decoded by arithmetic), minus the zero point, times the scale of
each (output row, input group), and multiplies them with tl.dot."""

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32  # tl.dot needs at least 16 in each dimension


@triton.jit
def _quantized_matmul_kernel(x_ptr, codes_ptr, scale_ptr, zero_ptr, bias_ptr, out_ptr, M, N: tl.constexpr,
                             K: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, FLOATING: tl.constexpr,
                             HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_valid, cols_valid = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        inside = (ks[:, None] < K) & cols_valid[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + ks[None, :],
                    mask=rows_valid[:, None] & (ks[None, :] < K), other=0.0)
        width = K * BITS // 8  # bytes per weight row
        byte = tl.load(codes_ptr + cols[None, :].to(tl.int64) * width + ks[:, None] * BITS // 8, mask=inside,
                       other=0).to(tl.int32)
        if BITS == 4:  # input 2j in the low nibble, 2j + 1 in the high one
            byte = (byte >> ((ks[:, None] % 2) * 4)) & 15
        if FLOATING and BITS == 8:  # e4m3
            exponent, mantissa = (byte >> 3) & 15, byte & 7
            fraction = mantissa.to(tl.float32) / 8
            magnitude = tl.where(exponent > 0, (1.0 + fraction) * tl.exp2((exponent - 7).to(tl.float32)),
                                 fraction / 64)  # subnormal: mantissa * 2^-9
            value = tl.where((byte & 0x80) != 0, -magnitude, magnitude)
        elif FLOATING:  # e2m1
            exponent, mantissa = (byte >> 1) & 3, byte & 1
            fraction = mantissa.to(tl.float32) / 2
            magnitude = tl.where(exponent > 0, (1.0 + fraction) * tl.exp2((exponent - 1).to(tl.float32)), fraction)
            value = tl.where((byte & 8) != 0, -magnitude, magnitude)
        else:
            value = (byte - (1 << (BITS - 1))).to(tl.float32)
        groups = cols[None, :].to(tl.int64) * (K // GROUP) + ks[:, None] // GROUP
        if HAS_ZERO:
            value -= tl.load(zero_ptr + groups, mask=inside, other=0.0)
        w = (value * tl.load(scale_ptr + groups, mask=inside, other=0.0)).to(x.dtype)
        if IEEE:  # float32 activations: full-precision products, not TF32
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols_valid, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rows_valid[:, None] & cols_valid[None, :])


def quantized_matmul(x: torch.Tensor, codes: torch.Tensor, bits: int, floating: bool, scale: torch.Tensor,
                     zero: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) for W's codes [N, K * bits / 8] with scale (and zero) [N, K / group]."""
    x = x.contiguous()
    m, k = x.shape
    n = codes.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _quantized_matmul_kernel[grid](x, codes, scale, zero, bias, out, m, N=n, K=k, GROUP=k // scale.shape[1],
                                   BITS=bits, FLOATING=floating, HAS_ZERO=zero is not None, HAS_BIAS=bias is not None,
                                   IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                   BLOCK_K=BLOCK_K)
    return out
