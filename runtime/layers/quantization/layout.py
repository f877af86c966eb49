"""A checkpoint's tensors brought to one layout: codes as compressed-tensors packs them (rows first, int32
words along the inputs, integers offset by 2**(bits - 1)), and scales and zero points a value per output row and
group of inputs, [rows, columns / group] (a block's or the whole tensor's scale repeated over its rows and groups,
packed zero points unpacked). GPTQ's and AWQ's layouts (inputs first) are read into it. Tensor parallelism then
shards them as it shards the rows or inputs of the weight."""

import torch

from runtime.errors import InvalidInputError
from runtime.layers.quantization.scheme import WeightScheme

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the row each of a word's eight 4-bit values holds, in AWQ's GEMM packing


def codes_by_row(loaded: torch.Tensor, rows: int, columns: int, weights: WeightScheme) -> torch.Tensor:
    """A [rows, columns] matrix's codes as compressed-tensors packs them (GPTQ's and AWQ's read into it)."""
    if weights.layout == "awq":  # [columns, rows / 8], along the rows
        return _pack(_awq_rows(_unpack(loaded, weights.bits)).t(), weights.bits)
    if weights.legacy:  # GPTQ's words run along the inputs already: [columns * bits / 32, rows]
        return loaded.t().contiguous()
    return loaded


def scales_by_row(loaded: torch.Tensor, rows: int, columns: int, group: int, weights: WeightScheme) -> torch.Tensor:
    """A scale tensor for a [rows, columns] matrix as [rows, columns / group] floats."""
    return _by_row(loaded.t() if weights.legacy else loaded, rows, columns, group)


def check_unused(name: str, loaded: torch.Tensor, weights: WeightScheme) -> None:
    """A tensor of `weights.unused_names`, which the projection reads nothing from; GPTQ's `g_idx` (each input's
    group) must be the plain order: act-order (`desc_act`) reorders the inputs."""
    if name == "g_idx" and not torch.equal(loaded.long(),
                                           torch.arange(loaded.numel()) // weights.inputs_per_scale(loaded.numel())):
        raise InvalidInputError("model", "GPTQ act-order checkpoints (desc_act: a g_idx that reorders the inputs) "
                                "are not supported yet")


def _by_row(loaded: torch.Tensor, rows: int, columns: int, group: int) -> torch.Tensor:
    loaded = loaded.float().reshape(loaded.shape[0] if loaded.dim() == 2 else 1, -1)
    if loaded.shape[0] != rows:  # a block's rows, or the whole tensor's
        loaded = loaded.repeat_interleave(-(-rows // loaded.shape[0]), dim=0)[:rows]
    return loaded.repeat_interleave(columns // group // loaded.shape[1], dim=1)


def zero_points_by_row(loaded: torch.Tensor, rows: int, columns: int, group: int, weights: WeightScheme
                       ) -> torch.Tensor:
    """Zero points as `scales_by_row` gives scales, in code values; packed ones (int32 words along the output
    rows, each value offset by 2**(bits - 1), GPTQ's less one too) unpacked first."""
    bits = weights.bits
    if weights.legacy:  # [groups, rows * bits / 32]
        values = _unpack(loaded, bits)
        values = (_awq_rows(values) if weights.layout == "awq" else values)[:, :rows]
        loaded = (values + (weights.layout == "gptq") - (1 << (bits - 1))).t()
    elif weights.packed:  # [rows * bits / 32, groups]
        loaded = _unpack(loaded.t(), bits)[:, :rows].t() - (1 << (bits - 1))
    return _by_row(loaded, rows, columns, group)


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words [..., n] as their values [..., n * 32 / bits], each word's first value in its lowest bits."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).flatten(-2)


def _pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """`_unpack`'s inverse: values [..., n] in int32 words [..., n * bits / 32]."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=values.device)
    words = (values.long().reshape(*values.shape[:-1], -1, 32 // bits) << shifts).sum(dim=-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _awq_rows(values: torch.Tensor) -> torch.Tensor:
    """Values unpacked from AWQ's words [..., rows] put back in row order."""
    order = torch.tensor(_AWQ_ORDER, device=values.device)
    rows = (torch.arange(0, values.shape[-1], 8, device=values.device)[:, None] + order).flatten()
    natural = torch.empty_like(values)
    natural[..., rows] = values
    return natural


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
