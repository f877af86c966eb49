"""quantized_matmul.cpp for float32 CPU activations: a projection against a weight that stays quantized, its
codes, scales and zero points packed once (`pack`) so that each task's tile of output columns is contiguous."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _library():
    library = build.load("quantized_matmul")
    if library is None:
        return None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    library.quantized_matmul_f32.argtypes = [pointer, ctypes.c_long, integer, integer, pointer, integer, integer,
                                             pointer, pointer, integer, pointer, pointer, integer]
    library.quantized_matmul_f32.restype = None
    library.quantized_matmul_tile.restype = integer
    return library


def pack(codes: torch.Tensor, bits: int, scale: torch.Tensor, zero: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """Codes [out, in * bits / 8] (uint8), scale and zero [out, groups] packed per tile of output columns as
    the kernel reads them; None where it does not serve them (not on CPU, an output width off the tile, no
    compiler)."""
    if codes.device.type != "cpu" or _library() is None:
        return None
    out, width = codes.shape
    tile = _library().quantized_matmul_tile()
    if out % tile:
        return None
    if bits == 4:  # two codes per byte along the input -> columns j (low) and j + tile / 2 (high) of a tile
        values = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(out, 2 * width)  # [out, in]
        halves = values.reshape(out // tile, 2, tile // 2, -1)  # [tiles, low/high, column, in]
        tiled = (halves[:, 0] | (halves[:, 1] << 4)).permute(0, 2, 1)  # [tiles, in, tile / 2]
    else:
        tiled = codes.reshape(out // tile, tile, width).transpose(1, 2)
    def by_tile(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.float().reshape(out // tile, tile, -1).transpose(1, 2).contiguous()
    return tiled.contiguous(), by_tile(scale), by_tile(zero)


def quantized_matmul(x: torch.Tensor, codes: torch.Tensor, bits: int, floating: bool, scale: torch.Tensor,
                     zero: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """x [N, in] (float32) @ the `pack`ed weight's transpose, plus `bias`: [N, out]. Codes are floats if
    `floating` (FP8 e4m3 for 8 bits, FP4 e2m1 for 4), else integers offset by 2**(bits - 1)."""
    tiles, inner, _ = codes.shape
    groups = scale.shape[1]
    out = torch.empty(x.shape[0], tiles * scale.shape[2], dtype=torch.float32)
    x = x.contiguous()
    bias = None if bias is None else bias.float().contiguous()
    _library().quantized_matmul_f32(x.data_ptr(), x.shape[0], inner, out.shape[1], codes.data_ptr(), bits,
                                    int(floating), scale.data_ptr(), None if zero is None else zero.data_ptr(),
                                    inner // groups, None if bias is None else bias.data_ptr(), out.data_ptr(),
                                    torch.get_num_threads())
    return out
