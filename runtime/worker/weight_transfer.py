"""New weights sent by a trainer over torch.distributed, as RL frameworks push them to SGLang
(`init_weights_update_group`, then `update_weights_from_distributed`).

The trainer and every engine rank form a process group of their own (not the default one, which a
tensor-parallel engine already uses): gloo on CPU, nccl on GPU, met at the trainer's TCP store. The trainer is
rank 0; an engine rank joins as `rank_offset` plus its tensor-parallel rank (a served model's replicas each add
their index times the tensor-parallel size). Each tensor is broadcast from the trainer whole; every engine rank
receives it and its weight loaders take their shards.
"""

from datetime import timedelta

import torch
import torch.distributed as dist

JOIN_TIMEOUT = timedelta(minutes=5)
BACKENDS = ("gloo", "nccl")


class WeightGroup:
    """One side of the trainer's weight-transfer group: `WeightGroup.join` on an engine rank, `WeightGroup.lead`
    on the trainer."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, backend: str, device: torch.device):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.device = device
        self.rank = rank
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(store, rank, world_size, JOIN_TIMEOUT)
        else:
            self.group = dist.ProcessGroupNCCL(store, rank, world_size)

    @classmethod
    def join(cls, address: str, port: int, rank: int, world_size: int, backend: str,
             device: torch.device) -> "WeightGroup":
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=JOIN_TIMEOUT)
        return cls(store, rank, world_size, backend, device)

    @classmethod
    def lead(cls, address: str, port: int, world_size: int, backend: str = "gloo",
             device: torch.device | str = "cpu") -> "WeightGroup":
        """The trainer's side, rank 0 (the store's host): returns once every engine rank has joined."""
        store = dist.TCPStore(address, port, world_size, is_master=True, timeout=JOIN_TIMEOUT)
        return cls(store, 0, world_size, backend, torch.device(device))

    def send(self, tensors: list[torch.Tensor]) -> None:
        """The trainer's: broadcast each tensor, in the order its update names them."""
        for tensor in tensors:
            self._broadcast(tensor.to(self.device).contiguous())

    def receive(self, dtypes: list[torch.dtype], shapes: list[list[int]]) -> list[torch.Tensor]:
        """An engine rank's: the tensors the trainer broadcasts, in order."""
        tensors = []
        for dtype, shape in zip(dtypes, shapes):
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            self._broadcast(tensor)
            tensors.append(tensor)
        return tensors

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()
