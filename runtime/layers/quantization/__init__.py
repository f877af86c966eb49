"""Quantized checkpoints: what their config says (`Quantization`), and projections and MoE experts that keep
their weights quantized (`quantize_model` before loading, `finish_quantized_linears` after; experts finish in
their `pack`, as the float ones do)."""

from runtime.layers.quantization.checkpoint import Quantization
from runtime.layers.quantization.linear import finish_quantized_linears, quantize_model

__all__ = ["Quantization", "finish_quantized_linears", "quantize_model"]
