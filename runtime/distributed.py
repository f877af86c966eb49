"""Parallel group state and collectives; a single process is one rank and needs nothing.

A replica's ranks form `pipeline_parallel_size` stages of `tensor_parallel_size` ranks each; global rank
`stage x tp + tp_rank`. Every rank joins one torch.distributed group (gloo on CPU, nccl on GPU), its stage's
tensor-parallel group for the layers' collectives, and a gloo group used to broadcast each step's inputs from
rank 0, so workers need no Ray call per step. Neighbouring stages pass hidden states point to point, tensor
rank r to tensor rank r.
"""

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class PipelineStage:
    """This rank's pipeline stage: `index` of `count`, over the layers `partition` gives it (layers per stage;
    default: even, the remainder to the last stages, since stage 0 also runs the LM head and the sampler)."""

    index: int = 0
    count: int = 1
    partition: tuple[int, ...] | None = None

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def sizes(self, num_layers: int) -> list[int]:
        if self.partition is not None:
            return list(self.partition)
        sizes = [num_layers // self.count] * self.count
        for i in range(num_layers % self.count):
            sizes[-1 - i] += 1
        return sizes

    def layers(self, num_layers: int) -> range:
        sizes = self.sizes(num_layers)
        start = sum(sizes[: self.index])
        return range(start, start + sizes[self.index])


_control_group = None
_tp_group = None  # this stage's tensor-parallel ranks
_tp_size = 1
_rank = 0
_stage = PipelineStage()
_expert_parallel = False


def set_expert_parallel(enabled: bool) -> None:
    """Whether MoE experts are spread whole over the ranks (`enable_expert_parallel`), for the models built next."""
    global _expert_parallel
    _expert_parallel = enabled


def expert_parallel() -> bool:
    return _expert_parallel and tp_size() > 1


def set_pipeline_stage(stage: PipelineStage) -> None:
    """The stage whose layers the models built next hold."""
    global _stage
    _stage = stage


def pipeline_stage() -> PipelineStage:
    return _stage


def tp_rank() -> int:
    return _rank % _tp_size


def tp_size() -> int:
    return _tp_size


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


def init_groups(rank: int, tp: int, pp: int, address: str, device: str, timeout_s: float = 120) -> None:
    """Join the replica's `tp x pp` ranks as global `rank`."""
    global _control_group, _tp_group, _tp_size, _rank
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=tp * pp,
                            timeout=timedelta(seconds=timeout_s))
    _control_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    _tp_group = dist.group.WORLD
    if pp > 1:  # every rank creates every stage's group, in the same order
        stages = [dist.new_group(list(range(s * tp, (s + 1) * tp)), backend=backend) for s in range(pp)]
        _tp_group = stages[rank // tp]
    _tp_size, _rank = tp, rank


def destroy_groups() -> None:
    global _control_group, _tp_group, _tp_size, _rank
    if dist.is_initialized():
        dist.destroy_process_group()
    _control_group = _tp_group = None
    _tp_size, _rank = 1, 0


def broadcast_from_rank0(obj=None):
    """Rank 0 sends `obj` to every rank; the others receive and return it."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group)
    return box[0]


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _tp_size > 1:
        dist.all_reduce(x, group=_tp_group)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum over the stage's ranks, in place."""
    if _tp_size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=_tp_group)
    return x


def all_reduce_min(value: int) -> int:
    """The minimum over every rank of the replica."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_control_group)
    return int(t.item())


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every stage rank's `x` along the last dimension, in rank order."""
    if _tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_tp_group)
    return torch.cat(parts, dim=-1)


def send_to_stage(x: torch.Tensor, stage: int, tag: int) -> dist.Work:
    """Start sending `x` to the same tensor rank of pipeline `stage`; wait on the returned work."""
    return dist.isend(x.contiguous(), dst=stage * _tp_size + tp_rank(), tag=tag)


def receive_from_stage(x: torch.Tensor, stage: int, tag: int) -> torch.Tensor:
    """Fill `x` with what the same tensor rank of pipeline `stage` sends."""
    dist.recv(x, src=stage * _tp_size + tp_rank(), tag=tag)
    return x
