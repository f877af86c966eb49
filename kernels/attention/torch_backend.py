"""The `torch` attention backend: the reference over the paged KV cache (CPU, and the oracle for the kernels).

Decode sequences that share leading blocks (a common system prompt served
from the prefix cache) are grouped, so attention reads the shared prefix once
per group instead of once per sequence; each prefill chunk is one SDPA call
over the slots of its whole context. A sliding-window layer reads each row's
last `window` slots only: its decode rows and prefill spans are a view of their
own, built on first use and shared by every layer with that window.
"""

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels.attention.backend import AttentionBackend, AttentionMetadata, new_tokens
from kernels.transfer import to_device

_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


@dataclass
class DecodeGroup:
    """Decode rows that share their first `len(prefix_slots)` context tokens (under a window: none)."""

    rows: torch.Tensor  # indices of the group's rows among the decode rows
    prefix_slots: torch.Tensor  # [P] slots of the shared prefix (P may be 0)
    suffix_slots: torch.Tensor  # [rows, S] the slots each row reads after the prefix, padded
    suffix_mask: torch.Tensor  # [rows, 1, 1, S] True for real (unpadded) positions


@dataclass
class PrefillSpan:
    """One prefill chunk: its rows in the flattened batch and the slots it attends to."""

    start: int
    end: int
    slots: torch.Tensor  # [context_len] cache slots of the whole context, chunk included
    mask: torch.Tensor | None  # [chunk_len, context_len] True where attention is allowed; None: causal


@dataclass
class AttentionView:
    """How the batch's rows read the cache under one window: decode groups and prefill spans."""

    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSpan]


@dataclass
class TorchMetadata(AttentionMetadata):
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    all_slots: torch.Tensor  # [num_seqs, max context] every sequence's slots (CPU), valid up to its context length
    block_size: int
    device: torch.device
    views: dict[int | None, AttentionView] = field(default_factory=dict)

    def view(self, window: int | None) -> AttentionView:
        """The rows' reads for layers that see the last `window` positions (None: all), built once per step."""
        if window not in self.views:
            self.views[window] = _build_view(self, window)
        return self.views[window]


class TorchBackend(AttentionBackend):
    name = "torch"

    def build_metadata(self, query_lens, context_lens, block_tables, block_size, num_decodes, device) -> TorchMetadata:
        tokens = new_tokens(query_lens, context_lens, block_tables, block_size)
        positions = torch.arange(max(context_lens))
        # every sequence's slots for positions [0, max_ctx); rows are valid up to their context length
        all_slots = tokens.tables[:, positions // block_size] * block_size + positions % block_size
        return TorchMetadata(self, to_device(tokens.slots, device), num_decodes, query_lens, context_lens, block_tables,
                             all_slots, block_size, device)

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: TorchMetadata, scale: float, window=None, softcap=None,
               sinks=None) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, scale, window, softcap, sinks)


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Write new K/V rows [T, Hkv, D] into the cache at `slot_mapping` (an FP8 cache's rounded to e4m3 with a
    scale of 1, clamped to its range)."""
    for new, cache in ((k, k_cache), (v, v_cache)):
        rows = cache.view(-1, new.shape[1], new.shape[2])
        if cache.dtype == torch.float8_e4m3fn:  # moved as bytes: torch's CPU index_copy_ takes no FP8
            rows, new = rows.view(torch.uint8), new.clamp(-_FP8_MAX, _FP8_MAX).to(cache.dtype).view(torch.uint8)
        rows.index_copy_(0, slot_mapping, new)


def read_slots(flat: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows at `slots` in the queries' dtype (an FP8 cache's values widened; read as bytes, which torch's
    CPU index_select takes)."""
    if flat.dtype == torch.float8_e4m3fn:
        return flat.view(torch.uint8).index_select(0, slots).view(flat.dtype).to(dtype)
    return flat.index_select(0, slots).to(dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TorchMetadata,
                    scale: float, window: int | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of new queries [T, Hq, D] over each sequence's cached context (the backend's `attend`)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    view = meta.view(window)
    out = torch.empty_like(q)
    decodes = out[: meta.num_decodes]
    for group in view.decode_groups:
        decodes[group.rows] = _attend_decode_group(q[group.rows], k_flat, v_flat, group, scale, softcap, sinks)
    for span in view.prefills:
        # 4-d [1, H, L, D]: with a batch dimension torch's CPU flash kernel takes masks and GQA (3-d falls back
        # to the slower math path)
        qp = q[span.start : span.end].transpose(0, 1)[None]
        kp = read_slots(k_flat, span.slots, q.dtype).transpose(0, 1)[None]
        vp = read_slots(v_flat, span.slots, q.dtype).transpose(0, 1)[None]
        out[span.start : span.end] = masked_attention(qp, kp, vp, span.mask, scale, softcap, sinks)[0].transpose(0, 1)
    return out


def masked_attention(q, k, v, mask: torch.Tensor | None, scale: float, softcap: float | None,
               sinks: torch.Tensor | None) -> torch.Tensor:
    """q [B, Hq, L, D] over k, v [B, Hkv, S, D]; `mask` (True: allowed) broadcasts to [B, 1, L, S], None: causal.
    SDPA where it applies; with a soft cap or sinks, the scores written out."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                              enable_gqa=True)
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    per_kv = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(per_kv, dim=1), v.repeat_interleave(per_kv, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    sink = None if sinks is None else sinks.view(-1, 1, 1)
    return torch.matmul(_probs(scores, mask, softcap, sink).to(v.dtype), v)


def _probs(scores: torch.Tensor, allowed: torch.Tensor, softcap: float | None,
           sink: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension of scaled float32 `scores`: capped, masked where not `allowed`, and
    with the `sink` logit (broadcast to `scores[..., :1]`) taking its share when there is one."""
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sink is None:
        return torch.softmax(scores, dim=-1)
    sink = sink.float().expand_as(scores[..., :1])
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def _attend_decode_group(q: torch.Tensor, k_flat, v_flat, group: DecodeGroup, scale: float,
                         softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """One query per row over [shared prefix | own suffix]; the prefix is read once for the group."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_flat.shape[1]
    length = group.suffix_slots.shape[1]
    slots = group.suffix_slots.reshape(-1)
    k_suffix = read_slots(k_flat, slots, q.dtype).view(rows, length, num_kv_heads, head_dim)
    v_suffix = read_slots(v_flat, slots, q.dtype).view(rows, length, num_kv_heads, head_dim)
    prefix = group.prefix_slots.shape[0]
    if prefix == 0:
        out = masked_attention(q.unsqueeze(2), k_suffix.transpose(1, 2), v_suffix.transpose(1, 2), group.suffix_mask,
                         scale, softcap, sinks)
        return out.squeeze(2)
    # query heads grouped under their KV head: [rows, Hkv, G, D]
    per_kv = num_heads // num_kv_heads
    qg = q.view(rows, num_kv_heads, per_kv, head_dim)
    k_prefix = read_slots(k_flat, group.prefix_slots, q.dtype)  # [P, Hkv, D]
    v_prefix = read_slots(v_flat, group.prefix_slots, q.dtype)
    # the prefix as one matmul over every row's queries: [Hkv, rows * G, P]
    q_by_head = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, rows * per_kv, head_dim)
    s_prefix = torch.matmul(q_by_head, k_prefix.permute(1, 2, 0))
    s_prefix = s_prefix.view(num_kv_heads, rows, per_kv, prefix).permute(1, 0, 2, 3)
    s_suffix = torch.matmul(qg, k_suffix.permute(0, 2, 3, 1))
    allowed = torch.cat([group.suffix_mask.new_ones(1, 1, 1, prefix).expand(rows, 1, 1, prefix),
                         group.suffix_mask], dim=-1)
    sink = None if sinks is None else sinks.view(num_kv_heads, per_kv, 1)
    probs = _probs(torch.cat([s_prefix, s_suffix], dim=-1).float() * scale, allowed, softcap, sink).to(q.dtype)
    p_prefix = probs[..., :prefix].permute(1, 0, 2, 3).reshape(num_kv_heads, rows * per_kv, prefix)
    out = torch.matmul(p_prefix, v_prefix.transpose(0, 1)).view(num_kv_heads, rows, per_kv, head_dim)
    out = out.permute(1, 0, 2, 3) + torch.matmul(probs[..., prefix:], v_suffix.transpose(1, 2))
    return out.reshape(rows, num_heads, head_dim)


# --- building the metadata ----------------------------------------------------

def _build_view(meta: TorchMetadata, window: int | None) -> AttentionView:
    """Full attention groups the decode rows by shared prefix blocks (the prefix read once per group); under a
    window every decode row reads its own last `window` slots, and each prefill span the slots its rows see."""
    if window is None:
        groups = [_decode_group(rows, [prefix_blocks * meta.block_size] * len(rows), meta)
                  for rows, prefix_blocks in _shared_prefixes(meta.block_tables[: meta.num_decodes],
                                                              meta.context_lens, meta.block_size)]
    else:
        rows = list(range(meta.num_decodes))
        starts = [max(0, meta.context_lens[r] - window) for r in rows]
        groups = [_decode_group(rows, starts, meta, shared=False)] if rows else []
    return AttentionView(groups, _prefill_spans(meta, window))


def _prefill_spans(meta: TorchMetadata, window: int | None) -> list[PrefillSpan]:
    positions = torch.arange(meta.all_slots.shape[1])
    spans, start = [], meta.num_decodes
    for i in range(meta.num_decodes, len(meta.query_lens)):
        q, ctx = meta.query_lens[i], meta.context_lens[i]
        first = 0 if window is None else max(0, ctx - q - window + 1)  # the first position any row sees
        keys, queries = positions[first:ctx][None, :], positions[ctx - q : ctx, None]
        mask = None  # a whole prompt under full attention: plain causal
        if window is not None:
            mask = ((keys <= queries) & (keys > queries - window)).to(meta.device)
        elif ctx != q:  # a cached prefix precedes the chunk: causal with an offset
            mask = (keys <= queries).to(meta.device)
        spans.append(PrefillSpan(start, start + q, meta.all_slots[i, first:ctx].to(meta.device), mask))
        start += q
    return spans


def _shared_prefixes(tables: list[list[int]], context_lens: list[int], block_size: int):
    """Partition decode rows into (rows, number of leading blocks they all share).

    Rows are grouped by their first block; a group's prefix stops before any
    row's last token, so each row keeps at least its current token apart.
    Rows that share nothing form one group with an empty prefix.
    """
    by_first = defaultdict(list)
    for row, table in enumerate(tables):
        by_first[table[0]].append(row)
    alone = []
    for rows in by_first.values():
        if len(rows) == 1:
            alone += rows
            continue
        limit = min((context_lens[r] - 1) // block_size for r in rows)
        first = tables[rows[0]]
        shared = 0
        while shared < limit and all(tables[r][shared] == first[shared] for r in rows):
            shared += 1
        yield rows, shared
    if alone:
        yield alone, 0


def _decode_group(rows: list[int], starts: list[int], meta: TorchMetadata, shared: bool = True) -> DecodeGroup:
    """Decode `rows`, each reading its context from position `starts[i]` on; with `shared`, the positions
    before the (common) start are the group's shared prefix."""
    index = torch.tensor(rows, dtype=torch.long)
    first = torch.tensor(starts, dtype=torch.long)
    lens = torch.tensor([meta.context_lens[r] for r in rows], dtype=torch.long) - first
    longest = int(lens.max())
    columns = (first[:, None] + torch.arange(longest)[None, :]).clamp(max=meta.all_slots.shape[1] - 1)
    prefix = starts[0] if shared else 0
    device = meta.device
    return DecodeGroup(
        rows=to_device(index, device),
        prefix_slots=to_device(meta.all_slots[rows[0], :prefix], device),
        suffix_slots=to_device(meta.all_slots[index[:, None], columns], device),
        suffix_mask=to_device((torch.arange(longest)[None, :] < lens[:, None])[:, None, None, :], device),
    )
