"""The `cpu` attention backend: attention.cpp over the paged cache, for float32 and head sizes
that are multiples of 16 up to 256 (the torch reference serves the rest); K/V are stored by the reference."""

import ctypes
import functools
from dataclasses import dataclass

import torch

from kernels.attention.backend import AttentionBackend, AttentionMetadata, new_tokens
from kernels.attention.torch_backend import store_kv_cache
from kernels.cpu import build

HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 256, 576)  # the instances attention.cpp compiles (576: DeepSeek's latent)


@functools.cache
def _kernel():
    library = build.load("attention")
    if library is None:
        return None
    kernel = library.paged_attention_f32
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    kernel.argtypes = [pointer, pointer, pointer, pointer, integer, pointer, pointer, integer, integer, integer,
                       integer, integer, ctypes.c_float, integer, ctypes.c_float, pointer, pointer, integer]
    kernel.restype = integer
    return kernel


def supports(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel serves these shapes on this machine (building it on first call)."""
    return dtype == torch.float32 and head_dim in HEAD_DIMS and _kernel() is not None


@dataclass
class CpuMetadata(AttentionMetadata):
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    row_seq: torch.Tensor  # [num_tokens] int32: each new token's sequence
    row_len: torch.Tensor  # [num_tokens] int32: how many context tokens each new token attends to


class CpuBackend(AttentionBackend):
    name = "cpu"

    def build_metadata(self, query_lens, context_lens, block_tables, block_size, num_decodes, device) -> CpuMetadata:
        tokens = new_tokens(query_lens, context_lens, block_tables, block_size)
        return CpuMetadata(self, tokens.slots, num_decodes, tokens.tables.to(torch.int32),
                           tokens.seqs.to(torch.int32), (tokens.positions + 1).to(torch.int32))

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: CpuMetadata, scale: float, window=None, softcap=None,
               sinks=None) -> torch.Tensor:
        q = q.contiguous()
        out = torch.empty_like(q)
        num_rows, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.dtype == torch.float32
        sinks = None if sinks is None else sinks.float().contiguous()
        status = _kernel()(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), meta.block_tables.data_ptr(),
            meta.block_tables.shape[1], meta.row_seq.data_ptr(), meta.row_len.data_ptr(), num_rows, num_heads,
            num_kv_heads, head_dim, block_size, scale, window or 0, softcap or 0.0,
            None if sinks is None else sinks.data_ptr(), out.data_ptr(), torch.get_num_threads(),
        )
        if status:
            raise ValueError(f"head size {head_dim} has no CPU kernel instance (have {HEAD_DIMS})")
        return out
