"""The `torch` attention backend: the reference over the paged KV cache (CPU, and the oracle for the kernels).

Decode sequences that share leading blocks (a common system prompt served
from the prefix cache) are grouped, so attention reads the shared prefix once
per group instead of once per sequence; each prefill chunk is one SDPA call
over the slots of its whole context.
"""

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention_backend import AttentionBackend, AttentionMetadata, new_tokens


@dataclass
class DecodeGroup:
    """Decode rows that share their first `len(prefix_slots)` context tokens."""

    rows: torch.Tensor  # indices of the group's rows among the decode rows
    prefix_slots: torch.Tensor  # [P] slots of the shared prefix (P may be 0)
    suffix_slots: torch.Tensor  # [rows, S] each row's slots after the prefix, padded
    suffix_mask: torch.Tensor  # [rows, 1, 1, S] True for real (unpadded) positions


@dataclass
class PrefillSpan:
    """One prefill chunk: its rows in the flattened batch and the slots it attends to."""

    start: int
    end: int
    slots: torch.Tensor  # [context_len] cache slots of the whole context, chunk included
    mask: torch.Tensor | None  # [chunk_len, context_len] True where attention is allowed; None: causal


@dataclass
class TorchMetadata(AttentionMetadata):
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSpan]


class TorchBackend(AttentionBackend):
    name = "torch"

    def build_metadata(self, query_lens, context_lens, block_tables, block_size, num_decodes, device) -> TorchMetadata:
        tokens = new_tokens(query_lens, context_lens, block_tables, block_size)
        positions = torch.arange(max(context_lens))
        # every sequence's slots for positions [0, max_ctx); rows are valid up to their context length
        all_slots = tokens.tables[:, positions // block_size] * block_size + positions % block_size
        groups = [
            _decode_group(rows, prefix_blocks * block_size, all_slots, context_lens, device)
            for rows, prefix_blocks in _shared_prefixes(block_tables[:num_decodes], context_lens, block_size)
        ]
        prefills = _prefill_spans(query_lens, context_lens, num_decodes, all_slots, device)
        return TorchMetadata(self, tokens.slots.to(device), num_decodes, groups, prefills)

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: TorchMetadata, scale: float) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, scale)


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Write new K/V rows [T, Hkv, D] into the cache at `slot_mapping`."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TorchMetadata,
                    scale: float) -> torch.Tensor:
    """Causal attention of new queries [T, Hq, D] over each sequence's cached context."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    decodes = out[: meta.num_decodes]
    for group in meta.decode_groups:
        decodes[group.rows] = _attend_decode_group(q[group.rows], k_flat, v_flat, group, scale)
    for span in meta.prefills:
        # 4-d [1, H, L, D]: with a batch dimension torch's CPU flash kernel takes masks and GQA (3-d falls back
        # to the slower math path)
        qp = q[span.start : span.end].transpose(0, 1)[None]
        kp = k_flat.index_select(0, span.slots).transpose(0, 1)[None]
        vp = v_flat.index_select(0, span.slots).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=True
        )
        out[span.start : span.end] = o[0].transpose(0, 1)
    return out


def _attend_decode_group(q: torch.Tensor, k_flat, v_flat, group: DecodeGroup, scale: float) -> torch.Tensor:
    """One query per row over [shared prefix | own suffix]; the prefix is read once for the group."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_flat.shape[1]
    length = group.suffix_slots.shape[1]
    slots = group.suffix_slots.reshape(-1)
    k_suffix = k_flat.index_select(0, slots).view(rows, length, num_kv_heads, head_dim)
    v_suffix = v_flat.index_select(0, slots).view(rows, length, num_kv_heads, head_dim)
    prefix = group.prefix_slots.shape[0]
    if prefix == 0:
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k_suffix.transpose(1, 2), v_suffix.transpose(1, 2),
            attn_mask=group.suffix_mask, scale=scale, enable_gqa=True,
        )
        return out.squeeze(2)
    # query heads grouped under their KV head: [rows, Hkv, G, D]
    per_kv = num_heads // num_kv_heads
    qg = q.view(rows, num_kv_heads, per_kv, head_dim)
    k_prefix = k_flat.index_select(0, group.prefix_slots)  # [P, Hkv, D]
    v_prefix = v_flat.index_select(0, group.prefix_slots)
    # the prefix as one matmul over every row's queries: [Hkv, rows * G, P]
    q_by_head = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, rows * per_kv, head_dim)
    s_prefix = torch.matmul(q_by_head, k_prefix.permute(1, 2, 0))
    s_prefix = s_prefix.view(num_kv_heads, rows, per_kv, prefix).permute(1, 0, 2, 3)
    s_suffix = torch.matmul(qg, k_suffix.permute(0, 2, 3, 1)).masked_fill(~group.suffix_mask, float("-inf"))
    probs = torch.softmax(torch.cat([s_prefix, s_suffix], dim=-1).float() * scale, dim=-1).to(q.dtype)
    p_prefix = probs[..., :prefix].permute(1, 0, 2, 3).reshape(num_kv_heads, rows * per_kv, prefix)
    out = torch.matmul(p_prefix, v_prefix.transpose(0, 1)).view(num_kv_heads, rows, per_kv, head_dim)
    out = out.permute(1, 0, 2, 3) + torch.matmul(probs[..., prefix:], v_suffix.transpose(1, 2))
    return out.reshape(rows, num_heads, head_dim)


# --- building the metadata ----------------------------------------------------

def _prefill_spans(query_lens, context_lens, num_decodes: int, all_slots: torch.Tensor,
                   device: torch.device) -> list[PrefillSpan]:
    positions = torch.arange(all_slots.shape[1])
    spans, start = [], num_decodes
    for i in range(num_decodes, len(query_lens)):
        q, ctx = query_lens[i], context_lens[i]
        mask = None
        if ctx != q:  # a cached prefix precedes the chunk: causal with an offset
            mask = (positions[:ctx][None, :] <= positions[ctx - q : ctx, None]).to(device)
        spans.append(PrefillSpan(start, start + q, all_slots[i, :ctx].to(device), mask))
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


def _decode_group(rows: list[int], prefix: int, all_slots: torch.Tensor, context_lens: list[int],
                  device: torch.device) -> DecodeGroup:
    lens = torch.tensor([context_lens[r] for r in rows])
    longest = int(lens.max())
    index = torch.tensor(rows)
    suffix_positions = torch.arange(prefix, longest)
    return DecodeGroup(
        rows=index.to(device),
        prefix_slots=all_slots[rows[0], :prefix].to(device),
        suffix_slots=all_slots[index][:, prefix:longest].to(device),
        suffix_mask=(suffix_positions[None, :] < lens[:, None])[:, None, None, :].to(device),
    )
