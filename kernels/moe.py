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
    return fused_experts_reference(x, weights, ids, gate_up, down, activation, gate_up_bias, down_bias, packed)


def fused_experts_reference(x, weights, ids, gate_up, down, activation, gate_up_bias=None, down_bias=None,
                            packed=None):
    """The torch version of `fused_experts` (with the C++ grouped product given `packed` weights): the CPU path,
    and the oracle for the Triton kernel."""
    tokens, top_k = ids.shape
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    packed_gate_up, packed_down = packed or (None, None)
    num_experts = gate_up.shape[0] if packed is None else packed_gate_up.shape[0]
    ends = torch.bincount(flat, minlength=num_experts).cumsum(0)
    row_experts = flat[order]
    hidden = _grouped_matmul(x, gate_up, ends, order // top_k, packed_gate_up)
    if gate_up_bias is not None:
        hidden = hidden + gate_up_bias[row_experts]
    out = _grouped_matmul(activation(hidden), down, ends, packed=packed_down)
    if down_bias is not None:
        out = out + down_bias[row_experts]
    out = out * weights.flatten()[order, None].to(x.dtype)
    unsorted = torch.empty_like(out)
    unsorted[order] = out
    return unsorted.view(tokens, top_k, -1).sum(dim=1)


def _grouped_matmul(rows: torch.Tensor, weight: torch.Tensor | None, ends: torch.Tensor,
                    index: torch.Tensor | None = None, packed: torch.Tensor | None = None) -> torch.Tensor:
    """`rows[index]` (or `rows`) [N, in] sorted by expert, times each segment's expert `weight` [E, in, out]:
    [N, out].

    `ends` [E] is where each expert's segment ends. The C++ kernel over the `packed` weight when there is one;
    else one grouped matmul where torch has one (2.8 and later; on a quiet 2-core machine it beat one bmm over
    groups padded to the largest by 1.4x on the MoE benchmark), else one matmul per segment."""
    if packed is not None:
        return cpu_grouped.grouped_matmul(rows, packed, ends, index)
    if index is not None:
        rows = rows[index]
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm(rows, weight, offs=ends.to(torch.int32))
    starts = [0, *ends.tolist()[:-1]]
    return torch.cat([rows[s:e] @ w for s, e, w in zip(starts, ends.tolist(), weight)])
