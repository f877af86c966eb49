"""Tensor-parallel group state and collectives; a single process is TP=1 and needs nothing."""

import torch
import torch.distributed as dist


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along the last dimension, in rank order."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
