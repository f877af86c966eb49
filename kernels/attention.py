"""Attention over the paged KV cache: the torch reference backend.

The KV cache of one layer is a pair of tensors shaped
`[num_blocks, block_size, num_kv_heads, head_dim]`; token `i` of a sequence
lives at slot `block_table[i // block_size] * block_size + i % block_size`.

A step's batch is flattened: all scheduled tokens of all sequences are
concatenated, decode sequences (one new token each) first, then prefill chunks
(several new tokens, possibly after a cached or earlier-computed prefix). The
metadata below is built once per step and shared by every layer.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One prefill chunk: its rows in the flattened batch and the slots it attends to."""

    start: int
    end: int
    slots: torch.Tensor  # [context_len] cache slots of the whole context, chunk included
    mask: torch.Tensor | None  # [chunk_len, context_len] True where attention is allowed


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V is stored
    num_decodes: int
    decode_slots: torch.Tensor | None  # [num_decodes, max_context] (padded)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context]
    prefills: list[PrefillSpan]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        num_decodes: int,
        device: torch.device,
    ) -> "AttentionMetadata":
        """`context_lens[i]` counts sequence i's tokens up to and including this step's chunk."""
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long)
        max_ctx = max(context_lens)
        positions = torch.arange(max_ctx)
        # every sequence's slots for positions [0, max_ctx); rows are valid up to their context length
        all_slots = tables[:, positions // block_size] * block_size + positions % block_size
        new_slots = [
            all_slots[i, ctx - q : ctx] for i, (q, ctx) in enumerate(zip(query_lens, context_lens))
        ]
        slot_mapping = torch.cat(new_slots).to(device)
        decode_slots = decode_mask = None
        if num_decodes:
            dec_ctx = max(context_lens[:num_decodes])
            decode_slots = all_slots[:num_decodes, :dec_ctx].to(device)
            lens = torch.tensor(context_lens[:num_decodes])
            decode_mask = (positions[:dec_ctx] < lens[:, None])[:, None, None, :].to(device)
        prefills = []
        start = num_decodes
        for i in range(num_decodes, len(query_lens)):
            q, ctx = query_lens[i], context_lens[i]
            mask = None
            if ctx != q:  # a cached prefix precedes the chunk: causal with an offset
                mask = (positions[:ctx][None, :] <= positions[ctx - q : ctx, None]).to(device)
            prefills.append(PrefillSpan(start, start + q, all_slots[i, :ctx].to(device), mask))
            start += q
        return cls(slot_mapping, num_decodes, decode_slots, decode_mask, prefills)


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V rows [T, Hkv, D] into the cache at `slot_mapping`."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of new queries [T, Hq, D] over each sequence's cached context.

    The new tokens' K/V must already be in the cache (`store_kv_cache`).
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    if meta.num_decodes:
        out[: meta.num_decodes] = _decode_attention(q[: meta.num_decodes], k_flat, v_flat, meta, scale)
    for span in meta.prefills:
        qp = q[span.start : span.end].transpose(0, 1)  # [Hq, Lq, D]
        kp = k_flat.index_select(0, span.slots).transpose(0, 1)  # [Hkv, Lk, D]
        vp = v_flat.index_select(0, span.slots).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=True
        )
        out[span.start : span.end] = o.transpose(0, 1)
    return out


def _decode_attention(q, k_flat, v_flat, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """One query per sequence, batched over the padded contexts."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_flat.shape[1]
    slots = meta.decode_slots.reshape(-1)
    k = k_flat.index_select(0, slots).view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = v_flat.index_select(0, slots).view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)
