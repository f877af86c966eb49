"""KV-cache store by slot mapping (negative slots are skipped), RMSNorm with the residual add fused in,
rotary embedding."""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, ROW: tl.constexpr, BLOCK: tl.constexpr,
                     FP8_MAX: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # a padding row of a CUDA graph's batch: nothing to store
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(k_ptr + token * ROW + offs, mask=mask)
    v = tl.load(v_ptr + token * ROW + offs, mask=mask)
    if FP8_MAX:  # an FP8 cache: e4m3 with a scale of 1, clamped to its range
        k = tl.minimum(tl.maximum(k.to(tl.float32), -FP8_MAX), FP8_MAX)
        v = tl.minimum(tl.maximum(v.to(tl.float32), -FP8_MAX), FP8_MAX)
    tl.store(k_cache_ptr + slot * ROW + offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    row = k.shape[1] * k.shape[2]
    fp8_max = torch.finfo(torch.float8_e4m3fn).max if k_cache.dtype == torch.float8_e4m3fn else 0.0
    _store_kv_kernel[(k.shape[0],)](k.contiguous(), v.contiguous(), k_cache, v_cache, slot_mapping,
                                    ROW=row, BLOCK=triton.next_power_of_2(row), FP8_MAX=fp8_max)


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, eps, N: tl.constexpr,
                     BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(new_residual_ptr + row * N + offs, x.to(new_residual_ptr.dtype.element_ty), mask=mask)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w  # rounded like the reference
    tl.store(out_ptr + row * N + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x, weight, eps, residual=None):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x2)
    new_residual = torch.empty_like(x2) if residual is not None else out
    res = residual.reshape(-1, shape[-1]).contiguous() if residual is not None else x2
    n = shape[-1]
    _rms_norm_kernel[(x2.shape[0],)](x2, res, weight, out, new_residual, eps, N=n,
                                     BLOCK=triton.next_power_of_2(n), HAS_RESIDUAL=residual is not None)
    out = out.view(shape)
    return out if residual is None else (out, new_residual.view(shape))


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    base = (token * HEADS + head) * 2 * HALF
    x1 = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + token * HALF + offs, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + token * HALF + offs, mask=mask, other=0.0)
    tl.store(out_ptr + base + offs, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + base + HALF + offs, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(x, cos, sin):
    x = x.contiguous()
    out = torch.empty_like(x)
    half = x.shape[2] // 2
    _rotary_kernel[(x.shape[0], x.shape[1])](x, cos, sin, out, HEADS=x.shape[1], HALF=half,
                                             BLOCK=triton.next_power_of_2(half))
    return out


def apply_rotary(q, k, cos, sin):
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
