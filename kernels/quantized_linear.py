"""Matmul against a weight that stays quantized in memory, `y = x @ W.T + bias`.

A `QuantizedWeight` holds codes (one byte each, or two 4-bit codes per byte), a lookup table from code to value
(INT4, INT8, FP8 e4m3 and FP4 e2m1 alike), and a scale and optional zero point per (output row, group of inputs):
`W[o, i] = (lut[code[o, i]] - zero[o, i // group]) * scale[o, i // group]`. The kernels dequantize tile by tile
inside the product: C++ on CPU (`kernels.cpu.quantized_matmul`, over its own tile layout), Triton on GPU
(`kernels.triton.quantized_matmul`); elsewhere, and as their oracle, the torch path dequantizes the whole
matrix for the call.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.cpu import quantized_matmul as cpu_quantized

_FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def code_table(kind: str, bits: int) -> torch.Tensor:
    """The value of each code: `int` codes are offset by 2**(bits - 1) (as compressed-tensors packs them),
    `float` ones are FP8 e4m3 (8 bits) or FP4 e2m1 (4 bits, MXFP4's) bit patterns."""
    codes = torch.arange(1 << bits, dtype=torch.int32)
    if kind == "float" and bits == 4:
        return torch.tensor(_FP4_E2M1)
    if kind == "float":
        return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    return (codes - (1 << (bits - 1))).float()


@dataclass
class QuantizedWeight:
    codes: torch.Tensor  # uint8 [out, in * bits / 8]; the CPU kernel's tiles once `packed`
    bits: int
    lut: torch.Tensor  # float32 [2 ** bits]
    floating: bool  # float codes (FP8 e4m3, FP4 e2m1), else integers offset by 2 ** (bits - 1)
    scale: torch.Tensor  # float32 [out, in / group]
    zero: torch.Tensor | None  # float32 like scale, in code values
    out_features: int
    in_features: int
    packed: bool = False

    @classmethod
    def build(cls, codes: torch.Tensor, kind: str, bits: int, scale: torch.Tensor,
              zero: torch.Tensor | None) -> "QuantizedWeight":
        """The weight of `kind` (int | float) codes, packed for the CPU kernel where it serves the shape."""
        out, width = codes.shape
        weight = cls(codes, bits, code_table(kind, bits).to(codes.device), kind == "float", scale.float(),
                     None if zero is None else zero.float(), out, width * 8 // bits)
        tiles = cpu_quantized.pack(codes, bits, weight.scale, weight.zero)
        if tiles is not None:
            weight.codes, weight.scale, weight.zero = tiles
            weight.packed = True
        return weight

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero) if t is not None)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.packed and x.dtype == torch.float32:
            return cpu_quantized.quantized_matmul(x, self.codes, self.bits, self.floating, self.scale, self.zero, bias)
        if x.is_cuda:
            from kernels.triton import quantized_matmul as triton_quantized  # a CPU machine may have no Triton

            return triton_quantized.quantized_matmul(x, self.codes, self.bits, self.floating, self.scale, self.zero,
                                                     bias)
        return self.reference_matmul(x, bias)

    def reference_matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The torch path, and the kernels' oracle: the whole matrix dequantized for the call."""
        return F.linear(x, self.dequantize().to(x.dtype), bias)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix [out, in]."""
        codes, scale, zero = self.codes, self.scale, self.zero
        if self.packed:  # [tiles, in, tile * bits / 8] and [tiles, groups, tile] back to rows
            if self.bits == 4:  # a tile's column j in the low nibble, j + tile / 2 in the high one
                codes = torch.cat([codes & 15, codes >> 4], dim=-1)
            codes = codes.transpose(1, 2).reshape(self.out_features, self.in_features)
            scale, zero = (None if t is None else t.transpose(1, 2).reshape(self.out_features, -1)
                           for t in (scale, zero))
        elif self.bits == 4:
            codes = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(self.out_features, self.in_features)
        values = self.lut[codes.long()]
        group = self.in_features // scale.shape[1]
        if zero is not None:
            values = values - zero.repeat_interleave(group, dim=1)
        return values * scale.repeat_interleave(group, dim=1)
