"""sampling.cpp for float32 CPU logits: temperature, top-k, top-p, min-p and one draw per row (kernels/sampling.py)."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _library():
    library = build.load("sampling")
    if library is None:
        return None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    library.sample_f32.argtypes = [pointer] * 7 + [integer] * 3
    library.sample_f32.restype = None
    return library


def applies(logits: torch.Tensor) -> bool:
    """Whether the kernel serves these logits: float32 on the CPU, once the library is built."""
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and _library() is not None


def sample(logits, temperatures, top_ks, top_ps, min_ps, uniforms) -> torch.Tensor:
    logits = logits.contiguous()
    rows, size = logits.shape
    columns = [temperatures.to(torch.float32), top_ks.to(torch.long), top_ps.to(torch.float32),
               min_ps.to(torch.float32), uniforms.to(torch.float64)]
    columns = [column.contiguous() for column in columns]
    out = torch.empty(rows, dtype=torch.long)
    _library().sample_f32(logits.data_ptr(), *(column.data_ptr() for column in columns), out.data_ptr(), rows, size,
                          torch.get_num_threads())
    return out
