"""Paged attention for a mixed batch: one kernel for the decode rows, one for the prefill chunks.

K/V are read straight from the paged cache (the new tokens' K/V must already
be stored), walking each sequence's context through its block table with an
online softmax. A decode program serves every query head that shares one KV
head, so each KV row is read once per step, not once per query head; a
prefill program serves one query head and a block of query rows. A sliding
window starts each row's walk at its window's first block and masks what lies
before it; soft-capped scores and per-head sinks (the running max starts at
the sink, its share in the normaliser) follow the torch reference.

Dots take the queries' dtype (bf16/fp16 on the tensor cores, fp32
accumulation; an FP8 cache's values are widened to it as they are read);
float32 uses full-precision dots, not TF32, so it matches the torch reference.
`TritonBackend` (the `triton` attention backend) runs them, with the KV store of
`elementwise.py`.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.attention.backend import AttentionBackend, AttentionMetadata, new_tokens
from kernels.transfer import tensor_on, to_device
from kernels.triton.elementwise import store_kv_cache

_NO_WINDOW = 1 << 30  # a window no context reaches: full causal attention


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _load_kv(k_cache_ptr, v_cache_ptr, table_ptr, pos, pos_mask, kv_head, d, d_mask, NUM_KV_HEADS: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, DTYPE: tl.constexpr):
    """K and V rows of one KV head at context positions `pos`, found through the sequence's block table, as
    DTYPE (the queries': an FP8 cache's values widened)."""
    page = tl.load(table_ptr + pos // BLOCK_SIZE, mask=pos_mask, other=0)
    slot = page.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    offs = (slot[:, None] * NUM_KV_HEADS + kv_head) * HEAD_DIM + d[None, :]
    mask = pos_mask[:, None] & d_mask[None, :]
    return (tl.load(k_cache_ptr + offs, mask=mask, other=0.0).to(DTYPE),
            tl.load(v_cache_ptr + offs, mask=mask, other=0.0).to(DTYPE))


@triton.jit
def _online_softmax_step(q, k, v, allowed, m_i, l_i, acc, scale, softcap, IEEE: tl.constexpr,
                         SOFTCAP: tl.constexpr):
    """Fold one block of keys into the running max `m_i`, normaliser `l_i` and output `acc`."""
    s = _dot(q, tl.trans(k), IEEE) * scale
    if SOFTCAP:
        s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap * tanh(s / softcap)
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet (under a window)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def _start(sinks_ptr, heads, mask, ROWS: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The running max and normaliser before any key: empty, or holding the heads' sinks."""
    if HAS_SINKS:
        return tl.load(sinks_ptr + heads, mask=mask, other=0.0).to(tl.float32), tl.full([ROWS], 1.0, tl.float32)
    return tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32)


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, table_stride, context_lens_ptr, scale, window,
    softcap, sinks_ptr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)  # decode row `seq` is sequence `seq`'s one new token
    kv_head = tl.program_id(1)
    group: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    ctx = tl.load(context_lens_ptr + seq)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < group
    d_mask = d < HEAD_DIM
    q_offs = (seq.to(tl.int64) * NUM_HEADS + kv_head * group + g[:, None]) * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i, l_i = _start(sinks_ptr, kv_head * group + g, g_mask, BLOCK_G, HAS_SINKS)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    first = tl.maximum(ctx - window, 0)  # the first position in the window
    for start in range(first // BLOCK_N * BLOCK_N, ctx, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_mask = (pos < ctx) & (pos >= first)
        k, v = _load_kv(k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * table_stride, pos, pos_mask, kv_head, d,
                        d_mask, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, q_ptr.dtype.element_ty)
        m_i, l_i, acc = _online_softmax_step(q, k, v, pos_mask[None, :], m_i, l_i, acc, scale, softcap, IEEE,
                                             SOFTCAP)
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, table_stride, query_start_ptr, context_lens_ptr,
    scale, window, softcap, sinks_ptr, first_seq, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    seq = first_seq + tl.program_id(0)
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
    q = tl.load(q_ptr + q_offs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    m_i, l_i = _start(sinks_ptr, head + 0 * rows, row_mask, BLOCK_M, HAS_SINKS)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    last = ctx - q_len + tl.minimum(q_len, tl.program_id(2) * BLOCK_M + BLOCK_M)  # keys up to the last row
    first = tl.maximum(ctx - q_len + tl.program_id(2) * BLOCK_M - window + 1, 0)  # the first row's window
    for start in range(first // BLOCK_N * BLOCK_N, last, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_mask = (pos < last) & (pos >= first)
        k, v = _load_kv(k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * table_stride, pos, pos_mask, kv_head, d,
                        d_mask, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, q_ptr.dtype.element_ty)
        allowed = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window) & pos_mask[None, :]
        m_i, l_i, acc = _online_softmax_step(q, k, v, allowed, m_i, l_i, acc, scale, softcap, IEEE, SOFTCAP)
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, max_query_len: int,
                    num_decodes: int, scale: float, window: int | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D], its first `num_decodes` rows one decode each; caches [blocks, block_size, Hkv, D]; per
    sequence its block table, query start and context length; the layer's window, soft cap and sinks as
    `AttentionBackend.attend` takes them. Launches depend only on shapes and the host integers, so a
    decode-only step can be captured in a CUDA graph."""
    num_seqs = block_tables.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    q = q.contiguous()
    out = torch.empty_like(q)
    shapes = dict(NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
                  BLOCK_D=max(16, triton.next_power_of_2(head_dim)), IEEE=q.dtype == torch.float32,
                  SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None)
    layer = (window or _NO_WINDOW, softcap or 1.0, q if sinks is None else sinks)  # q: a pointer never read
    if num_decodes:
        _decode_kernel[(num_decodes, num_kv_heads)](
            q, k_cache, v_cache, out, block_tables, block_tables.stride(0), context_lens, scale, *layer,
            BLOCK_G=max(16, triton.next_power_of_2(num_heads // num_kv_heads)), BLOCK_N=64, **shapes)
    if num_seqs > num_decodes:
        block_m = 16 if max_query_len <= 16 else 64
        grid = (num_seqs - num_decodes, num_heads, triton.cdiv(max_query_len, block_m))
        _prefill_kernel[grid](q, k_cache, v_cache, out, block_tables, block_tables.stride(0), query_start_loc,
                              context_lens, scale, *layer, num_decodes, BLOCK_M=block_m, BLOCK_N=32, **shapes)
    return out


@dataclass
class TritonMetadata(AttentionMetadata):
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: each sequence's first row in the batch
    context_lens: torch.Tensor  # [num_seqs] int32
    max_query_len: int


class TritonBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True

    def build_metadata(self, query_lens, context_lens, block_tables, block_size, num_decodes, device):
        tokens = new_tokens(query_lens, context_lens, block_tables, block_size)
        starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return self.metadata(to_device(tokens.slots, device), num_decodes,
                             to_device(tokens.tables.to(torch.int32), device), to_device(starts, device),
                             tensor_on(context_lens, torch.int32, device),
                             max(query_lens), max(context_lens))

    def metadata(self, slot_mapping, num_decodes: int, block_tables, query_start_loc, context_lens,
                 max_query_len: int, max_context_len: int) -> TritonMetadata:
        """The metadata over tensors already on the device: a CUDA graph wraps its fixed input buffers so."""
        return TritonMetadata(self, slot_mapping, num_decodes, block_tables, query_start_loc, context_lens,
                              max_query_len)

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: TritonMetadata, scale: float, window=None, softcap=None,
               sinks=None) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.context_lens,
                               meta.max_query_len, meta.num_decodes, scale, window, softcap, sinks)
