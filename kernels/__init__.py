"""Pure compute used by the engine's models: attention over the paged KV cache,
KV-cache writes, projections against packed or quantized weights, RMSNorm, rotary embeddings and
the MLP's activation, a mixture-of-experts layer's experts, and the sampler's argmax and draw.

Each operation has one interface here; the implementation behind it is chosen
per device (the torch reference runs everywhere and is the oracle for faster
backends). Attention is an object: the `AttentionBackend` chosen once per
engine, which builds each step's metadata, stores K/V and attends.
"""

from kernels.activation import clamped_swiglu, gelu_tanh_and_mul, silu_and_mul
from kernels.attention.backend import AttentionBackend, AttentionMetadata
from kernels.attention.select import choose_attention_backend
from kernels.linear import linear, pack_weight
from kernels.moe import fused_experts
from kernels.norm import rms_norm
from kernels.quantized_linear import QuantizedWeight, code_table
from kernels.reduce import argmax
from kernels.rotary import apply_rotary
from kernels.sampling import sample
from kernels.transfer import tensor_on, to_device

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "QuantizedWeight",
    "argmax",
    "choose_attention_backend",
    "code_table",
    "fused_experts",
    "linear",
    "pack_weight",
    "rms_norm",
    "sample",
    "apply_rotary",
    "clamped_swiglu",
    "gelu_tanh_and_mul",
    "silu_and_mul",
    "tensor_on",
    "to_device",
]
