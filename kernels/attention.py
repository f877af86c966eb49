"""Attention over the paged KV cache: the torch reference backend (CPU, and the oracle for GPU kernels)."""

import torch
import torch.nn.functional as F

from kernels.attention_metadata import AttentionMetadata, DecodeGroup


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V rows [T, Hkv, D] into the cache at `slot_mapping`."""
    if k.is_cuda:
        from kernels.triton.elementwise import store_kv_cache as triton_store

        return triton_store(k, v, k_cache, v_cache, slot_mapping)
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
    if meta.backend == "triton":
        from kernels.triton.attention import paged_attention as triton_attention

        return triton_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.context_lens,
                                meta.max_query_len, meta.num_decodes, scale)
    if meta.backend == "cpu":
        from kernels.cpu.attention import paged_attention as cpu_attention

        return cpu_attention(q, k_cache, v_cache, meta, scale)
    if meta.backend == "flash":
        from kernels.flash import paged_attention as flash_attention

        return flash_attention(q, k_cache, v_cache, meta, scale)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    decodes = out[: meta.num_decodes]
    for group in meta.decode_groups:
        decodes[group.rows] = _decode_group(q[group.rows], k_flat, v_flat, group, scale)
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


def _decode_group(q: torch.Tensor, k_flat, v_flat, group: DecodeGroup, scale: float) -> torch.Tensor:
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
