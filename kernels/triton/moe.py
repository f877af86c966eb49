"""The fused mixture-of-experts kernel: a grouped GEMM over the step's (token, expert) pairs sorted by expert.

Each expert's pairs are padded to a whole number of BLOCK_M rows, so every row block of the sorted list
belongs to one expert and multiplies one weight matrix. The kernel gathers its rows by pair index, adds the
expert's bias, optionally scales each row by its top-k weight, and stores each result at its pair's row:
the output is in (token, k) order, with no scatter left to do. Sorting needs no host sync (the padded length
has a static bound and the expert counts are an index_add, not a bincount, which syncs on CUDA), as a CUDA
graph's capture requires.
"""

import torch
import triton
import triton.language as tl

from kernels.expert_order import sort_by_expert

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32  # tl.dot needs at least 16 in each dimension


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, bias_ptr, scale_ptr, out_ptr, pair_ptr, expert_ptr, num_pairs,
                         N: tl.constexpr, K: tl.constexpr, A_ROW_DIVISOR: tl.constexpr, HAS_BIAS: tl.constexpr,
                         SCALE: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """out[pair] = (a[pair // A_ROW_DIVISOR] @ w[expert] + bias[expert]) * scale[pair], for the pairs of one
    BLOCK_M row block and BLOCK_N output columns. Padding rows hold `num_pairs` and are masked."""
    block = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pairs = tl.load(pair_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    rows_valid = pairs < num_pairs
    if tl.max(rows_valid.to(tl.int32), axis=0) == 0:  # a block past the last expert's rows
        return
    expert = tl.load(expert_ptr + block).to(tl.int64)
    a_rows = (pairs // A_ROW_DIVISOR).to(tl.int64)
    cols_valid = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * K + ks[None, :], mask=rows_valid[:, None] & (ks[None, :] < K),
                    other=0.0)
        w = tl.load(w_ptr + expert * K * N + ks[:, None] * N + cols[None, :],
                    mask=(ks[:, None] < K) & cols_valid[None, :], other=0.0)
        if IEEE:  # float32 weights: full-precision products, not TF32
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * N + cols, mask=cols_valid, other=0.0).to(tl.float32)[None, :]
    if SCALE:
        acc *= tl.load(scale_ptr + pairs, mask=rows_valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + pairs.to(tl.int64)[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rows_valid[:, None] & cols_valid[None, :])


def _sort_pairs(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair indices (token * top_k + k) sorted by expert, each expert's run padded with `ids.numel()` to a
    multiple of BLOCK_M, and each row block's expert."""
    flat, order, counts = sort_by_expert(ids, num_experts)
    num_pairs = flat.numel()
    padded_counts = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_ends = padded_counts.cumsum(0)
    shift = (padded_ends - padded_counts) - (counts.cumsum(0) - counts)  # each expert's padded minus packed start
    blocks = triton.cdiv(num_pairs, BLOCK_M) + num_experts  # a static bound on the padded row blocks
    pairs = torch.full((blocks * BLOCK_M,), num_pairs, dtype=torch.int32, device=ids.device)
    pairs[torch.arange(num_pairs, device=ids.device) + shift[flat[order]]] = order.to(torch.int32)
    block_starts = torch.arange(blocks, device=ids.device) * BLOCK_M
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return pairs, block_experts.to(torch.int32)


def _grouped_gemm(a, weight, bias, scale, pairs, block_experts, num_pairs, a_row_divisor):
    _, k, n = weight.shape
    out = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    grid = (block_experts.numel(), triton.cdiv(n, BLOCK_N))
    _grouped_gemm_kernel[grid](a.contiguous(), weight, bias, scale, out, pairs, block_experts, num_pairs, N=n, K=k,
                               A_ROW_DIVISOR=a_row_divisor, HAS_BIAS=bias is not None, SCALE=scale is not None,
                               IEEE=a.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out


def fused_experts(x, weights, ids, gate_up, down, activation, gate_up_bias=None, down_bias=None):
    """`kernels.moe.fused_experts` on CUDA: two launches of the grouped GEMM around the activation."""
    tokens, top_k = ids.shape
    pairs, block_experts = _sort_pairs(ids, gate_up.shape[0])
    hidden = _grouped_gemm(x, gate_up, gate_up_bias, None, pairs, block_experts, ids.numel(), top_k)
    out = _grouped_gemm(activation(hidden), down, down_bias, weights.flatten().contiguous(), pairs, block_experts,
                        ids.numel(), 1)
    return out.view(tokens, top_k, -1).sum(dim=1)
