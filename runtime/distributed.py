"""Tensor-parallel group state and collectives; a single process is TP=1 and needs nothing.

Ranks join one torch.distributed group (gloo on CPU, nccl on GPU) plus a gloo
group used to broadcast each step's inputs from rank 0, so workers need no
Ray call per step.
"""

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

_control_group = None
_expert_parallel = False


def set_expert_parallel(enabled: bool) -> None:
    """Whether MoE experts are spread whole over the ranks (`enable_expert_parallel`), for the models built next."""
    global _expert_parallel
    _expert_parallel = enabled


def expert_parallel() -> bool:
    return _expert_parallel and tp_size() > 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def free_address() -> str:
    """`tcp://host:port` on this machine, with a port free right now (chosen at start, never fixed)."""
    try:
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        host = "127.0.0.1"
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def init_tp_group(rank: int, world_size: int, address: str, device: str, timeout_s: float = 120) -> None:
    global _control_group
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    _control_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD


def destroy_tp_group() -> None:
    global _control_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _control_group = None


def broadcast_from_rank0(obj=None):
    """Rank 0 sends `obj` to every rank; the others receive and return it."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group)
    return box[0]


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum over the ranks, in place."""
    if tp_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_reduce_min(value: int) -> int:
    if tp_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_control_group)
    return int(t.item())


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along the last dimension, in rank order."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
