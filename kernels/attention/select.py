"""Which attention backend runs: `cpu` (the C++ kernel) on CPU where it applies, else `torch` (which is
also the oracle); `triton` as the GPU default, `flash` when vllm-flash-attn imports and matches the
installed torch. The GPU backends are imported only when chosen: a CPU machine may have no Triton."""

import torch

from kernels.attention.backend import AttentionBackend
from kernels.attention.torch_backend import TorchBackend
from kernels.cpu import attention as cpu_attention

BACKENDS = ("torch", "cpu", "triton", "flash")


def choose_attention_backend(requested: str, device: str, dtype: torch.dtype, head_dim: int,
                             cache_dtype: torch.dtype | None = None) -> AttentionBackend:
    """The backend named by `requested` (or the best for `auto`); ValueError where it cannot run. `cache_dtype`:
    the KV cache's, where it is not `dtype` (FP8: the torch and Triton backends read it)."""
    cache_dtype = cache_dtype or dtype
    if requested == "auto":
        return _make(_best(device, cache_dtype, head_dim))
    if requested not in BACKENDS:
        raise ValueError(f"unknown {requested!r}; available: auto, {', '.join(BACKENDS)}")
    if requested in ("triton", "flash") and device != "cuda":
        raise ValueError(f"{requested!r} needs a CUDA device")
    if requested == "flash" and not _flash_available():
        raise ValueError("'flash' needs vllm-flash-attn built for the installed torch")
    if requested in ("cpu", "flash") and cache_dtype != dtype:
        raise ValueError(f"{requested!r} reads a KV cache of the model's dtype; an FP8 cache needs torch or triton")
    if requested == "cpu" and (device != "cpu" or not cpu_attention.supports(dtype, head_dim)):
        raise ValueError(f"'cpu' needs a CPU device, float32, a head size in {cpu_attention.HEAD_DIMS} and a "
                         f"C++ compiler (g++ or $CXX); got {device}, {dtype}, head size {head_dim}")
    return _make(requested)


def _best(device: str, cache_dtype: torch.dtype, head_dim: int) -> str:
    if device != "cuda":
        return "cpu" if cpu_attention.supports(cache_dtype, head_dim) else "torch"
    if cache_dtype == torch.float8_e4m3fn:
        return "triton"
    return "flash" if head_dim <= 256 and _flash_available() else "triton"  # flash's largest head size


def _flash_available() -> bool:
    from kernels.attention import flash

    return flash.available()


def _make(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchBackend()
    if name == "cpu":
        return cpu_attention.CpuBackend()
    if name == "triton":
        from kernels.triton.attention import TritonBackend

        return TritonBackend()
    from kernels.attention.flash import FlashBackend

    return FlashBackend()
