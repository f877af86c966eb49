"""elementwise.cpp for float32 CPU tensors: RMSNorm with its residual add, rotary embedding, SiLU-and-mul,
row-wise argmax."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _library():
    library = build.load("elementwise")
    if library is None:
        return None
    pointer, integer, real = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    library.rms_norm_f32.argtypes = [pointer, pointer, pointer, pointer, pointer, integer, integer, real, integer]
    library.rotary_f32.argtypes = [pointer, ctypes.c_long, pointer, pointer, pointer, integer, integer, integer,
                                   integer]
    library.silu_and_mul_f32.argtypes = [pointer, pointer, integer, integer, integer]
    library.argmax_f32.argtypes = [pointer, pointer, integer, integer, integer]
    for kernel in (library.rms_norm_f32, library.rotary_f32, library.silu_and_mul_f32, library.argmax_f32):
        kernel.restype = None
    return library


def applies(*tensors: torch.Tensor | None) -> bool:
    """Whether these kernels serve these arguments (None: an absent optional one): float32 CPU tensors, once
    the library is built. Shapes are the caller's to check."""
    present = [t for t in tensors if t is not None]
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in present) and _library() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(rows)
    new_residual = None if residual is None else torch.empty_like(rows)
    residual_rows = None if residual is None else residual.reshape(-1, shape[-1]).contiguous()
    weight = weight.contiguous()
    _library().rms_norm_f32(
        rows.data_ptr(), 0 if residual is None else residual_rows.data_ptr(), weight.data_ptr(), out.data_ptr(),
        0 if residual is None else new_residual.data_ptr(), rows.shape[0], shape[-1], eps, torch.get_num_threads(),
    )
    if residual is None:
        return out.view(shape)
    return out.view(shape), new_residual.view(shape)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    cos, sin = cos.contiguous(), sin.contiguous()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    tokens, heads, size = x.shape
    if x.stride(2) != 1 or x.stride(1) != size:  # each token's heads must be contiguous; tokens may be apart
        x = x.contiguous()
    out = torch.empty(tokens, heads, size, dtype=x.dtype)
    _library().rotary_f32(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), tokens, heads,
                          size // 2, torch.get_num_threads())
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    tokens, size = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, size, dtype=gate_up.dtype)
    _library().silu_and_mul_f32(gate_up.data_ptr(), out.data_ptr(), tokens, size, torch.get_num_threads())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's argmax of a 2-d tensor, int64, as `x.argmax(dim=-1)`."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.long)
    _library().argmax_f32(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return out
