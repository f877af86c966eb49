"""Our model implementations and the loader that fills them from safetensors."""

from runtime.models.decoder import ARCHITECTURES, CausalLM
from runtime.models.layers import pack_linear_weights
from runtime.models.loader import load_weights

__all__ = ["ARCHITECTURES", "CausalLM", "load_weights", "pack_linear_weights"]
