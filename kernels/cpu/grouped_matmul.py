"""grouped_matmul.cpp for float32 CPU tensors: a mixture-of-experts layer's grouped product in one call."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _kernel():
    library = build.load("grouped_matmul")
    if library is None:
        return None
    kernel = library.grouped_matmul_f32
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    kernel.argtypes = [pointer, pointer, pointer, pointer, integer, integer, integer, pointer, integer]
    kernel.restype = integer
    return kernel


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel serves `x` [*, in] times experts `weight` [E, in, out] (building it on first call):
    float32 CPU tensors whose output width is a multiple of 32 columns (every vector width's tile divides it)."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() == 2
            and weight.shape[2] % 32 == 0 and _kernel() is not None)


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor,
                   index: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `x[index]` (or `x`), sorted by expert, times each segment's expert `weight` [E, in, out]: [N, out].
    `ends` [E] is where each expert's segment ends."""
    x, weight, ends = x.contiguous(), weight.contiguous(), ends.to(torch.long).contiguous()
    if index is not None:
        index = index.to(torch.long).contiguous()
    rows = index.shape[0] if index is not None else x.shape[0]
    out = torch.empty(rows, weight.shape[2], dtype=x.dtype)
    status = _kernel()(x.data_ptr(), None if index is None else index.data_ptr(), weight.data_ptr(),
                       ends.data_ptr(), weight.shape[0], weight.shape[1], weight.shape[2], out.data_ptr(),
                       torch.get_num_threads())
    assert status == 0, "applies() checks the output width"
    return out
