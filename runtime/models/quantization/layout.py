"""A checkpoint's scales and zero points brought to one layout: a value per output row and group of inputs,
[rows, columns / group] (a block's or the whole tensor's scale repeated over its rows and groups, packed zero
points unpacked). Tensor parallelism then shards them as it shards the rows or inputs of the weight."""

import torch

from runtime.models.quantization.scheme import WeightScheme


def scales_by_row(loaded: torch.Tensor, rows: int, columns: int, group: int) -> torch.Tensor:
    """A scale (or unpacked zero point) tensor for a [rows, columns] matrix as [rows, columns / group] floats."""
    loaded = loaded.float().reshape(loaded.shape[0] if loaded.dim() == 2 else 1, -1)
    if loaded.shape[0] != rows:  # a block's rows, or the whole tensor's
        loaded = loaded.repeat_interleave(-(-rows // loaded.shape[0]), dim=0)[:rows]
    return loaded.repeat_interleave(columns // group // loaded.shape[1], dim=1)


def zero_points_by_row(loaded: torch.Tensor, rows: int, columns: int, group: int, weights: WeightScheme
                       ) -> torch.Tensor:
    """Zero points as `scales_by_row` gives scales; packed ones (int32 words along the output rows, each value
    offset by 2**(bits - 1)) unpacked first."""
    if weights.packed:
        bits = weights.bits
        values = torch.stack([(loaded >> (bits * i)) & ((1 << bits) - 1) for i in range(32 // bits)],
                             dim=1).reshape(-1, loaded.shape[1])[:rows]
        loaded = values - (1 << (bits - 1))
    return scales_by_row(loaded, rows, columns, group)


def codes_dtype(weights: WeightScheme) -> torch.dtype:
    """The dtype the checkpoint stores the codes in: int32 words when packed, else int8 or FP8 e4m3."""
    if weights.type == "float":
        return torch.float8_e4m3fn
    return torch.int32 if weights.packed else torch.int8


def code_bytes(codes: torch.Tensor) -> torch.Tensor:
    """A checkpoint's codes as bytes, integers offset by 2**(bits - 1) as packed ones are (int8's two's complement
    shifted; int32 words split little-endian, the first value lowest)."""
    if codes.dtype == torch.int8:
        codes = (codes.to(torch.int16) + 128).to(torch.uint8)
    return codes.view(torch.uint8)
