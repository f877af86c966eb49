"""The gated MLP's activations: SiLU (or Gemma's tanh-approximated GELU) of the first half of each row times
its second half, and gpt-oss's clamped SwiGLU."""

import torch
import torch.nn.functional as F

from kernels.cpu import elementwise as cpu_elementwise


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` = [T, 2 * I] holding gate then up; returns [T, I]."""
    if cpu_elementwise.applies(gate_up) and gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0:
        return cpu_elementwise.silu_and_mul(gate_up)
    return silu_and_mul_reference(gate_up)


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """The torch version of `silu_and_mul`: the oracle for the kernel, and the fallback."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`gelu(gate, tanh approximation) * up` for `gate_up` = [T, 2 * I] holding gate then up (Gemma)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's experts' activation for `gate_up` = [T, 2 * I] holding gate then up: with the gate clamped to at
    most `limit` and up to +-`limit`, `gate * sigmoid(alpha * gate) * (up + 1)`."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)
