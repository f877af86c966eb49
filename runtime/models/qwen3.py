"""Qwen3: q and k normalised per head before the rotary embedding, its own head_dim."""

from runtime.models.decoder import CausalLM
from runtime.models.layers import RMSNorm


class Qwen3ForCausalLM(CausalLM):
    qk_norm = RMSNorm
