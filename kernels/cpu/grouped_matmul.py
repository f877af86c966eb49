"""grouped_matmul.cpp for float32 CPU tensors: a mixture-of-experts layer's grouped product in one call, over
expert weights packed once (`pack`) so that each task's tile of columns is contiguous."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _library():
    library = build.load("grouped_matmul")
    if library is None:
        return None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    library.grouped_matmul_f32.argtypes = [pointer, pointer, pointer, pointer, integer, integer, integer, pointer,
                                           pointer, pointer, pointer, integer]
    library.grouped_matmul_f32.restype = None
    library.grouped_matmul_tile.restype = integer
    return library


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """Experts' matrices `weight` [E, in, out] packed as the kernel reads them, [E, out / tile, in, tile]; None
    where the kernel does not serve them (not float32 on CPU, an output width off the tile, no compiler)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or _library() is None:
        return None
    experts, inner, outer = weight.shape
    tile = _library().grouped_matmul_tile()
    if outer % tile:
        return None
    return weight.detach().reshape(experts, inner, outer // tile, tile).transpose(1, 2).contiguous()


def grouped_matmul(x: torch.Tensor, packed: torch.Tensor, ends: torch.Tensor, index: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                   to: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `x[index]` (or `x`) [N, in], sorted by expert, times each segment's expert matrix, `pack`ed in
    `packed`, plus the expert's `bias` [E, out] and times the row's `scale` [N] where given: [N, out], row r
    of the product at row `to[r]` (a permutation of the rows) where given. `ends` [E] is where each expert's
    segment ends."""
    experts, tiles, inner, tile = packed.shape
    rows = x.shape[0] if index is None else index.shape[0]
    out = torch.empty(rows, tiles * tile, dtype=torch.float32)
    x, ends = x.contiguous(), ends.to(torch.long).contiguous()
    index, to = (None if t is None else t.to(torch.long).contiguous() for t in (index, to))
    bias, scale = (None if t is None else t.float().contiguous() for t in (bias, scale))
    _library().grouped_matmul_f32(*(None if t is None else t.data_ptr() for t in (x, index, packed, ends)), experts,
                                  inner, tiles * tile,
                                  *(None if t is None else t.data_ptr() for t in (bias, scale, to, out)),
                                  torch.get_num_threads())
    return out
