"""A projection's input quantized on the way in, as the checkpoint's scheme says (W8A8: INT8 or FP8 per token,
FP8 per group of 128 for block-FP8, or per tensor with the checkpoint's `input_scale`).

The values are rounded to the 8-bit grid and scaled back (what compressed-tensors computes), then multiplied in
the activation's own dtype.
"""

import torch

from runtime.distributed import all_reduce_max
from runtime.layers.quantization.scheme import ActivationScheme

_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def quantize_input(x: torch.Tensor, scheme: ActivationScheme, input_scale: torch.Tensor | None,
                   split_inputs: bool = False) -> torch.Tensor:
    """`x` [N, in] on the scheme's 8-bit grid; `split_inputs`: `x` is this rank's slice of each row (a
    row-parallel projection's), so a scale over whole rows takes the largest magnitude over the ranks."""
    largest = _FP8_MAX if scheme.type == "float" else 127.0
    lowest = -_FP8_MAX if scheme.type == "float" else -128.0
    if not scheme.dynamic:
        scale = input_scale.to(x.dtype)
        rows = x
    else:
        rows = x.unflatten(-1, (-1, scheme.group_size)) if scheme.strategy == "group" else x
        reduce = None if scheme.strategy == "tensor" else -1
        magnitude = rows.abs().amax() if reduce is None else rows.abs().amax(dim=reduce, keepdim=True)
        if split_inputs and scheme.strategy != "group":
            magnitude = all_reduce_max(magnitude)
        scale = magnitude / ((largest - lowest) / 2)  # half the grid's range, as compressed-tensors divides
        scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    scaled = torch.clamp(rows / scale, lowest, largest)
    rounded = scaled.to(torch.float8_e4m3fn).to(x.dtype) if scheme.type == "float" else torch.round(scaled)
    return (rounded * scale).reshape(x.shape)
