"""The `flash` backend: vllm-flash-attn's varlen call over the paged cache, when it is installed.

Optional (its wheels pin an old torch): chosen only when it imports against the installed torch.
"""

import torch


def available() -> bool:
    try:
        from vllm_flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:  # not installed, or built for another torch
        return False
    return torch.cuda.is_available()


def paged_attention(q, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
    from vllm_flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(
        q, k_cache, v_cache,
        cu_seqlens_q=meta.query_start_loc, max_seqlen_q=meta.max_query_len,
        seqused_k=meta.context_lens, max_seqlen_k=meta.max_context_len,
        softmax_scale=scale, causal=True, block_table=meta.block_tables,
    )
