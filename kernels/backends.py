"""Which attention implementation runs: `cpu` (the C++ kernel) on CPU where it applies, else `torch`
(which is also the oracle); `triton` as the GPU default, `flash` when vllm-flash-attn imports and
matches the installed torch."""

import torch

from kernels import flash
from kernels.cpu import attention as cpu_attention

BACKENDS = ("torch", "cpu", "triton", "flash")


def choose_attention_backend(requested: str, device: str, dtype: torch.dtype, head_dim: int) -> str:
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown {requested!r}; available: auto, {', '.join(BACKENDS)}")
        if requested in ("triton", "flash") and device != "cuda":
            raise ValueError(f"{requested!r} needs a CUDA device")
        if requested == "flash" and not flash.available():
            raise ValueError("'flash' needs vllm-flash-attn built for the installed torch")
        if requested == "cpu" and (device != "cpu" or not cpu_attention.supports(dtype, head_dim)):
            raise ValueError(f"'cpu' needs a CPU device, float32, a head size in {cpu_attention.HEAD_DIMS} and a "
                             f"C++ compiler (g++ or $CXX); got {device}, {dtype}, head size {head_dim}")
        return requested
    if device != "cuda":
        return "cpu" if cpu_attention.supports(dtype, head_dim) else "torch"
    return "flash" if flash.available() else "triton"
