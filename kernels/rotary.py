"""Rotary position embedding (the half-split layout used by Llama and Qwen)."""

import torch


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `q` [T, Hq, D] and `k` [T, Hk, D] by per-token `cos`/`sin` [T, D/2]."""
    if q.is_cuda:
        from kernels.triton.elementwise import apply_rotary as triton_rotary

        return triton_rotary(q, k, cos, sin)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
