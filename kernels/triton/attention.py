"""Paged attention in one kernel for decodes and prefill chunks (over any cached prefix).

Grid: (sequence, query head, block of query rows). Each program walks the
sequence's context through its block table, with an online softmax; a decode
is a chunk of one row. K/V are read straight from the paged cache: the new
tokens' K/V must already be stored.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_ptr, context_lens_ptr, scale,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // (NUM_HEADS // NUM_KV_HEADS)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    ctx = tl.load(context_lens_ptr + seq)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(2) * BLOCK_M >= q_len:
        return
    row_mask = rows < q_len
    q_pos = ctx - q_len + rows  # each query row's position in the sequence
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_offs = ((q_start + rows)[:, None].to(tl.int64) * NUM_HEADS + head) * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    last = ctx - q_len + tl.minimum(q_len, tl.program_id(2) * BLOCK_M + BLOCK_M)  # keys up to the last row
    for start in range(0, last, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_mask = pos < last
        page = tl.load(block_tables_ptr + seq * MAX_BLOCKS + pos // BLOCK_SIZE, mask=pos_mask, other=0)
        slot = page.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_offs = (slot[:, None] * NUM_KV_HEADS + kv_head) * HEAD_DIM + d[None, :]
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        allowed = (pos[None, :] <= q_pos[:, None]) & pos_mask[None, :]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, max_query_len: int,
                    scale: float) -> torch.Tensor:
    """q [T, Hq, D]; caches [blocks, block_size, Hkv, D]; per sequence its table, query start and context."""
    num_seqs = block_tables.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    out = torch.empty_like(q)
    block_m = 16
    grid = (num_seqs, q.shape[1], triton.cdiv(max_query_len, block_m))
    _paged_attention_kernel[grid](
        q.contiguous(), k_cache, v_cache, out, block_tables, query_start_loc, context_lens, scale,
        NUM_HEADS=q.shape[1], NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        MAX_BLOCKS=block_tables.shape[1], BLOCK_M=block_m, BLOCK_N=32,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )
    return out
