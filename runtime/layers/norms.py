"""RMS norms: the plain one, Gemma's (scaled by 1 + weight), and one over a width split across tensor-parallel
ranks."""

import torch
from torch import nn

from kernels import rms_norm
from runtime.distributed import all_reduce, tp_rank, tp_size
from runtime.layers.linear import default_weight_loader, shard


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


class ShardedRMSNorm(nn.Module):
    """RMSNorm over a width split across tensor-parallel ranks (OLMo 2's q/k norms span every head): each rank
    holds its slice of `size` and of the weight, and the mean square is summed over the ranks."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps, self.size = eps, size
        self.weight = nn.Parameter(torch.ones(size // tp_size()), requires_grad=False)
        self.weight.weight_loader = lambda p, loaded: p.data.copy_(shard(loaded, 0, p.shape[0], tp_rank()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        square_sum = h.pow(2).sum(-1, keepdim=True)
        if tp_size() > 1:
            square_sum = all_reduce(square_sum)
        return (self.weight * (h * torch.rsqrt(square_sum / self.size + self.eps))).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm, which scales by 1 + weight: the checkpoint's weight is stored plus one."""

    def __init__(self, size: int, eps: float):
        super().__init__(size, eps)
        self.weight.weight_loader = lambda p, loaded: default_weight_loader(p, loaded.float() + 1)
