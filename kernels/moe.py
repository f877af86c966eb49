"""A mixture-of-experts layer's experts: each token through its top-k experts' gated MLPs, summed with the
router's weights.

The experts are stacked input-major, `gate_up` [E, H, 2 I] (gate then up) and `down` [E, I, H], with optional
biases [E, 2 I] and [E, H]. The step's (token, expert) pairs are grouped by expert and each projection is one
grouped product over all experts, never a loop over tokens: on CPU the C++ grouped product over weights packed
for it (`kernels.cpu.grouped_matmul`, reading the tokens in expert order through an index) or else torch's grouped
matmul over the pairs sorted by expert, the fused Triton kernel (`kernels.triton.moe`) on CUDA.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.cpu import grouped_matmul as cpu_grouped
from kernels.expert_order import sort_by_expert


def fused_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor | None,
                  down: torch.Tensor | None, activation: Callable[[torch.Tensor], torch.Tensor],
                  gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                  packed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The weighted sum of the experts' outputs for tokens `x` [T, H] routed to `ids` [T, k] with `weights`
    [T, k]; `activation` maps [rows, 2 I] to [rows, I]. `packed`: gate_up and down as
    `kernels.cpu.grouped_matmul.pack` lays them out, for float32 on CPU; then `gate_up` and `down` may be None."""
    if x.is_cuda:
        from kernels.triton.moe import fused_experts as triton_fused_experts

        return triton_fused_experts(x, weights, ids, gate_up, down, activation, gate_up_bias, down_bias)
    if packed is not None:
        return _fused_experts_packed(x, weights, ids, *packed, activation, gate_up_bias, down_bias)
    return fused_experts_reference(x, weights, ids, gate_up, down, activation, gate_up_bias, down_bias)


def _fused_experts_packed(x, weights, ids, gate_up, down, activation, gate_up_bias, down_bias):
    """`fused_experts` through the C++ grouped product over packed `gate_up` and `down`: the tokens read in expert
    order through an index, and the biases, the router's weights and the return to token order done as each
    product's rows are written."""
    tokens, top_k = ids.shape
    _, order, counts = sort_by_expert(ids, gate_up.shape[0])
    ends = counts.cumsum(0)
    hidden = cpu_grouped.grouped_matmul(x, gate_up, ends, order // top_k, gate_up_bias)
    out = cpu_grouped.grouped_matmul(activation(hidden), down, ends, bias=down_bias, scale=weights.flatten()[order],
                                     to=order)
    return out.view(tokens, top_k, -1).sum(dim=1)


def fused_experts_reference(x, weights, ids, gate_up, down, activation, gate_up_bias=None, down_bias=None):
    """The torch version of `fused_experts`: the CPU path without packed weights, and the oracle for the Triton
    kernel and the C++ grouped product."""
    tokens, top_k = ids.shape
    flat, order, counts = sort_by_expert(ids, gate_up.shape[0])
    ends = counts.cumsum(0)
    rows, row_experts = x[order // top_k], flat[order]
    hidden = _grouped_matmul(rows, gate_up, ends)
    if gate_up_bias is not None:
        hidden = hidden + gate_up_bias[row_experts]
    out = _grouped_matmul(activation(hidden), down, ends)
    if down_bias is not None:
        out = out + down_bias[row_experts]
    out = out * weights.flatten()[order, None].to(x.dtype)
    unsorted = torch.empty_like(out)
    unsorted[order] = out
    return unsorted.view(tokens, top_k, -1).sum(dim=1)


def _grouped_matmul(rows: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """`rows` [N, in] sorted by expert, times each segment's expert `weight` [E, in, out]: [N, out].

    `ends` [E] is where each expert's segment ends. One grouped matmul where torch has one (2.8 and later: it beat
    one bmm over groups padded to the largest, see docs/performance.md), else one matmul per
    segment."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm(rows, weight, offs=ends.to(torch.int32))
    starts = [0, *ends.tolist()[:-1]]
    return torch.cat([rows[s:e] @ w for s, e, w in zip(starts, ends.tolist(), weight)])
