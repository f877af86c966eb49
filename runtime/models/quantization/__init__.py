"""Quantized checkpoints: what their config says (`Quantization`), and projections that keep their weights
quantized (`quantize_linears` before loading, `finish_quantized_linears` after)."""

from runtime.models.quantization.linear import finish_quantized_linears, quantize_linears
from runtime.models.quantization.scheme import Quantization

__all__ = ["Quantization", "finish_quantized_linears", "quantize_linears"]
