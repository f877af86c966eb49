"""Rotary position embedding (the half-split layout used by Llama and Qwen)."""

import torch

from kernels.cpu import elementwise as cpu_elementwise


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `q` [T, Hq, D] and `k` [T, Hk, D] by per-token `cos`/`sin` [T, D/2]."""
    if q.is_cuda:
        from kernels.triton.elementwise import apply_rotary as triton_rotary

        return triton_rotary(q, k, cos, sin)
    tokens, _, size = q.shape
    if (cpu_elementwise.applies(q, k, cos, sin) and k.shape[0] == tokens and k.shape[2] == size
            and cos.shape == sin.shape == (tokens, size // 2)):
        return cpu_elementwise.apply_rotary(q, k, cos, sin)
    return apply_rotary_reference(q, k, cos, sin)


def apply_rotary_reference(q, k, cos, sin):
    """The torch version of `apply_rotary`: the oracle for the kernels, and the fallback."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
