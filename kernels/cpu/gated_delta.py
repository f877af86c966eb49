"""gated_delta.cpp for float32 CPU tensors: the gated delta rule over a step's sequences (kernels/gated_delta.py)."""

import ctypes
import functools

import torch

from kernels.cpu import build


@functools.cache
def _library():
    library = build.load("gated_delta")
    if library is None:
        return None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    library.gated_delta_rule_f32.argtypes = [pointer] * 9 + [integer] * 6
    library.gated_delta_rule_f32.restype = None
    return library


def applies(*tensors: torch.Tensor) -> bool:
    """Whether the kernel serves these arguments: float32 CPU tensors, once the library is built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and _library() is not None


def gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens) -> torch.Tensor:
    if not states.is_contiguous():
        raise ValueError("the state pool must be contiguous")
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    slots, cu_seqlens = slots.to(torch.long).contiguous(), cu_seqlens.to(torch.long).contiguous()
    out = torch.empty_like(v)
    _library().gated_delta_rule_f32(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), states.data_ptr(), slots.data_ptr(),
        cu_seqlens.data_ptr(), out.data_ptr(), slots.shape[0], k.shape[1], v.shape[1], k.shape[2], v.shape[2],
        torch.get_num_threads(),
    )
    return out
