"""Qwen3: q and k normalised per head before the rotary embedding, its own head_dim."""

from runtime.layers.norms import RMSNorm
from runtime.models.decoder import CausalLM


class Qwen3ForCausalLM(CausalLM):
    qk_norm = RMSNorm
