"""RMSNorm, optionally fused with the residual add that precedes it."""

import torch

from kernels.cpu import elementwise as cpu_elementwise


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Normalise `x` (after adding `residual`, when given) in float32.

    With a residual, returns `(normed, new_residual)` where `new_residual` is
    `x + residual`, the input of the next block's residual connection.
    """
    if x.is_cuda:
        from kernels.triton.elementwise import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps, residual)
    if (cpu_elementwise.applies(x, weight, residual) and weight.shape == x.shape[-1:]
            and (residual is None or residual.shape == x.shape)):
        return cpu_elementwise.rms_norm(x, weight, eps, residual)
    return rms_norm_reference(x, weight, eps, residual)


def rms_norm_reference(x, weight, eps, residual=None):
    """The torch version of `rms_norm`: the oracle for the kernels, and the fallback."""
    dtype = x.dtype
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(dtype)
    return out if residual is None else (out, residual)
