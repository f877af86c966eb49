"""Pure compute used by the engine's models: attention over the paged KV cache,
KV-cache writes, projections against packed weights, RMSNorm, rotary embeddings and
the MLP's activation.

Each operation has one interface here; the implementation behind it is chosen
per device (the torch reference runs everywhere and is the oracle for faster
backends).
"""

from kernels.activation import silu_and_mul
from kernels.attention import paged_attention, store_kv_cache
from kernels.attention_metadata import AttentionMetadata
from kernels.backends import choose_attention_backend
from kernels.linear import linear, pack_weight
from kernels.norm import rms_norm
from kernels.rotary import apply_rotary

__all__ = [
    "AttentionMetadata",
    "choose_attention_backend",
    "linear",
    "pack_weight",
    "paged_attention",
    "store_kv_cache",
    "rms_norm",
    "apply_rotary",
    "silu_and_mul",
]
