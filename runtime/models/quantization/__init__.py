"""Quantized checkpoints: what their config says (`Quantization`), and projections and MoE experts that keep
their weights quantized (`quantize_model` before loading, `finish_quantized_linears` after; experts finish in
their `pack`, as the float ones do)."""

from runtime.models.quantization.linear import finish_quantized_linears, quantize_model
from runtime.models.quantization.scheme import Quantization

__all__ = ["Quantization", "finish_quantized_linears", "quantize_model"]
