"""Linear attention by the gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5), over a step's sequences, each
resuming the recurrent state it keeps in a slot of a state pool, and the short causal convolution before it.

Per value head, the state S [Dk, Dv] is decayed, corrected towards the new value and read by the query, token by
token:

    S = exp(g) * S;   S += k (beta * (v - k S));   o = q S

q and k come l2-normalised and q scaled by Dk ** -0.5 (the layer does both); several value heads may share one
key head (`num_v_heads // num_k_heads` consecutive ones each). Sequences are the step's segments of the flattened
token stream (`cu_seqlens`); a fresh sequence's slot must be zeroed first (`StateCache.fresh_states` does it).
"""

import torch
import torch.nn.functional as F

from kernels.cpu import gated_delta as cpu_gated_delta


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     states: torch.Tensor, slots: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """q, k [T, Hk, Dk], v [T, Hv, Dv], g (log decay) and beta [T, Hv], all float32; states [S, Hv, Dk, Dv]
    float32, updated in place at `slots` [B] (int64); cu_seqlens [B + 1] (int64). Returns o [T, Hv, Dv] float32."""
    if q.is_cuda:
        from kernels.triton.gated_delta import gated_delta_rule as triton_gated_delta_rule

        return triton_gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens)
    if cpu_gated_delta.applies(q, k, v, g, beta, states):
        return cpu_gated_delta.gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens)
    return gated_delta_rule_reference(q, k, v, g, beta, states, slots, cu_seqlens)


def gated_delta_rule_reference(q, k, v, g, beta, states, slots, cu_seqlens) -> torch.Tensor:
    """The torch version of `gated_delta_rule`: the oracle for the kernels, and the fallback. Steps every sequence's
    j-th token together, so a step of decodes is one pass."""
    group = v.shape[1] // k.shape[1]
    q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    starts, lens = cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1]
    out = torch.empty_like(v)
    state = states[slots]  # [B, Hv, Dk, Dv]
    for j in range(int(lens.max()) if len(lens) else 0):
        active = (lens > j).nonzero().squeeze(1)
        rows = starts[active] + j
        s = state[active] * g[rows].exp()[..., None, None]
        k_t = k[rows].unsqueeze(-1)  # [b, Hv, Dk, 1]
        delta = (v[rows] - (s * k_t).sum(-2)) * beta[rows].unsqueeze(-1)
        s = s + k_t * delta.unsqueeze(-2)
        out[rows] = (s * q[rows].unsqueeze(-1)).sum(-2)
        state[active] = s
    states[slots] = state
    return out


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor, slots: torch.Tensor,
                  query_lens: list[int]) -> torch.Tensor:
    """A depthwise causal convolution, then SiLU: x [T, C] in segments of `query_lens`, weight [C, K];
    conv_states [S, C, K - 1] hold each sequence's last K - 1 inputs (zeros before its first), read at `slots` [B]
    and advanced in place. Returns [T, C]."""
    width = weight.shape[1]
    out = torch.empty_like(x)
    decodes = next((i for i, n in enumerate(query_lens) if n != 1), len(query_lens))  # the leading one-token rows
    if decodes:
        window = torch.cat([conv_states[slots[:decodes]], x[:decodes].unsqueeze(-1)], dim=-1)  # [B, C, K]
        out[:decodes] = (window * weight).sum(-1)
        conv_states[slots[:decodes]] = window[..., 1:]
    start = decodes
    for i in range(decodes, len(query_lens)):
        end = start + query_lens[i]
        padded = torch.cat([conv_states[slots[i]], x[start:end].t()], dim=-1)  # [C, K - 1 + n]
        out[start:end] = F.conv1d(padded.unsqueeze(0), weight.unsqueeze(1), groups=x.shape[1])[0].t()
        conv_states[slots[i]] = padded[:, padded.shape[1] - (width - 1):]
        start = end
    return F.silu(out)
