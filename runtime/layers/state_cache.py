"""Per-sequence state of layers that keep one instead of per-token keys and values (linear attention's recurrent
and convolution states), in a pool of slots beside the paged KV cache.

The scheduler gives each running sequence a slot (`Sequence.state_slot`) and takes it back when the sequence
finishes, is aborted or preempted; a preempted sequence is recomputed from its first token, so its state is rebuilt,
never saved. A step tells every stateful layer which slot each of its sequences uses (`StateStep`); a sequence
whose step starts at its first token finds its slot zeroed first, and a later chunk of its prompt resumes the state
the previous chunk left.
"""

from dataclasses import dataclass

import torch
from torch import nn

from kernels import tensor_on


@dataclass
class StateStep:
    slots: torch.Tensor  # [B] int64: each sequence's slot, in the step's order
    cu_seqlens: torch.Tensor  # [B + 1] int64: where each sequence's tokens start in the flattened step
    query_lens: list[int]
    fresh: torch.Tensor  # the slots of sequences starting at their first token: zeroed before use

    @classmethod
    def build(cls, slots: list[int], query_lens: list[int], context_lens: list[int],
              device: torch.device) -> "StateStep":
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        fresh = [slot for slot, n, total in zip(slots, query_lens, context_lens) if n == total]
        return cls(tensor_on(slots, torch.long, device), tensor_on(starts, torch.long, device), query_lens,
                   tensor_on(fresh, torch.long, device))


class StatefulLayer(nn.Module):
    """A layer that keeps state per sequence: it names the shapes of its states (this rank's share), the model
    runner allocates `num_slots` of each into `states` and sets `step` before every forward pass."""

    cuda_graphs = False  # a step's slots and segments are read on the host

    def __init__(self):
        super().__init__()
        self.states: dict[str, torch.Tensor] = {}
        self.step: StateStep | None = None

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def fresh_states(self) -> dict[str, torch.Tensor]:
        """This step's view of the states, the fresh sequences' slots zeroed."""
        if len(self.step.fresh):
            for state in self.states.values():
                state.index_fill_(0, self.step.fresh, 0)
        return self.states


def stateful_layers(model: nn.Module) -> list[StatefulLayer]:
    return [m for m in model.modules() if isinstance(m, StatefulLayer)]


def allocate_states(layers: list[StatefulLayer], num_slots: int, device: torch.device) -> None:
    """Give each layer `num_slots` of each of its states."""
    for layer in layers:
        layer.states = {name: torch.zeros((num_slots, *shape), dtype=dtype, device=device)
                        for name, (shape, dtype) in layer.state_shapes().items()}

