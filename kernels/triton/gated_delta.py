"""The gated delta rule (kernels/gated_delta.py) over a step's sequences on the GPU: one program per (sequence,
value head, block of value features) keeps that slice of the state [dk, BV] in registers across the sequence's
tokens and writes it back to its slot at the end."""

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_delta_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, slots_ptr, cu_ptr, out_ptr,
                        NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr):
    seq, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kh = h // (NUM_V_HEADS // NUM_K_HEADS)
    start, end = tl.load(cu_ptr + seq), tl.load(cu_ptr + seq + 1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    rows = tl.arange(0, BK)
    cols = vb * BV + tl.arange(0, BV)
    row_mask, col_mask = rows < DK, cols < DV
    tile = (slot * NUM_V_HEADS + h) * DK * DV + rows[:, None] * DV + cols[None, :]
    tile_mask = row_mask[:, None] & col_mask[None, :]
    s = tl.load(states_ptr + tile, mask=tile_mask, other=0.0)
    for t in range(start, end):  # int64, as cu_seqlens is
        q = tl.load(q_ptr + (t * NUM_K_HEADS + kh) * DK + rows, mask=row_mask, other=0.0)
        k = tl.load(k_ptr + (t * NUM_K_HEADS + kh) * DK + rows, mask=row_mask, other=0.0)
        v = tl.load(v_ptr + (t * NUM_V_HEADS + h) * DV + cols, mask=col_mask, other=0.0)
        decay = tl.exp(tl.load(g_ptr + t * NUM_V_HEADS + h))
        beta = tl.load(beta_ptr + t * NUM_V_HEADS + h)
        s = s * decay
        delta = beta * (v - tl.sum(s * k[:, None], axis=0))
        s = s + k[:, None] * delta[None, :]
        tl.store(out_ptr + (t * NUM_V_HEADS + h) * DV + cols, tl.sum(s * q[:, None], axis=0), mask=col_mask)
    tl.store(states_ptr + tile, s, mask=tile_mask)


def gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens) -> torch.Tensor:
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty_like(v)
    num_k_heads, dk = k.shape[1:]
    num_v_heads, dv = v.shape[1:]
    block_v = min(64, triton.next_power_of_2(dv))
    grid = (slots.shape[0], num_v_heads, triton.cdiv(dv, block_v))
    _gated_delta_kernel[grid](q, k, v, g, beta, states, slots, cu_seqlens, out, NUM_K_HEADS=num_k_heads,
                              NUM_V_HEADS=num_v_heads, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=block_v)
    return out
