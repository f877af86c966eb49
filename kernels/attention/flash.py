"""The `flash` attention backend: vllm-flash-attn's varlen call over the paged cache, when it is installed.

Optional (its wheels pin an old torch): chosen only when it imports against the installed torch. It stores
K/V and reads its metadata as the `triton` backend does, plus the longest context. Sliding windows and soft
caps are its own arguments; a layer with attention sinks runs the `triton` kernel instead.
"""

from dataclasses import dataclass

import torch

from kernels.triton.attention import TritonBackend, TritonMetadata


def available() -> bool:
    try:
        from vllm_flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:  # not installed, or built for another torch
        return False
    return torch.cuda.is_available()


@dataclass
class FlashMetadata(TritonMetadata):
    max_context_len: int


class FlashBackend(TritonBackend):
    name = "flash"

    def metadata(self, slot_mapping, num_decodes, block_tables, query_start_loc, context_lens, max_query_len,
                 max_context_len) -> FlashMetadata:
        # a block freed before every layer's window (-1 in the table) is never attended to, but its page may be
        # loaded: point it at block 0
        return FlashMetadata(self, slot_mapping, num_decodes, block_tables.clamp(min=0), query_start_loc,
                             context_lens, max_query_len, max_context_len)

    def attend(self, q, k_cache, v_cache, meta: FlashMetadata, scale: float, window=None, softcap=None,
               sinks=None) -> torch.Tensor:
        if sinks is not None:
            return super().attend(q, k_cache, v_cache, meta, scale, window, softcap, sinks)
        from vllm_flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func(
            q, k_cache, v_cache,
            cu_seqlens_q=meta.query_start_loc, max_seqlen_q=meta.max_query_len,
            seqused_k=meta.context_lens, max_seqlen_k=meta.max_context_len,
            softmax_scale=scale, causal=True, block_table=meta.block_tables,
            window_size=(-1, -1) if window is None else (window - 1, 0), softcap=softcap or 0.0,
        )
