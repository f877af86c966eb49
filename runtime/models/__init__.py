"""Our model implementations, the registry that picks one per checkpoint, and the loader that fills it."""

from runtime.layers.linear import pack_linear_weights
from runtime.models.decoder import CausalLM
from runtime.models.loader import load_weights
from runtime.models.registry import SUPPORTED_ARCHITECTURES, model_class

__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "load_weights", "model_class", "pack_linear_weights"]
