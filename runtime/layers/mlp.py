"""The gated MLP (gate and up projections merged, then down), and transformers' activations by name."""

from collections.abc import Callable

import torch
from torch import nn

from kernels import silu_and_mul
from runtime.distributed import all_reduce
from runtime.layers.linear import MergedColumnParallelLinear, RowParallelLinear

# On CPU a long prefill goes through the MLP this many rows at a time, so the wide gate/up activations
# stay in cache
_CPU_MLP_ROWS = 512


class MLP(nn.Module):
    """The gated MLP (SiLU, or another `activation` of gate times up), its intermediate features split across
    ranks."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 activation: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul):
        super().__init__()
        self.activation = activation
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """The output, or this rank's partial sum of it when the caller reduces (an MoE block's shared expert)."""
        # with LoRA, every projection sees the whole step: its adapters' rows are the step's rows
        if x.is_cuda or x.shape[0] <= _CPU_MLP_ROWS or self.down_proj.lora is not None:
            return self.down_proj(self._gated(x), reduce=reduce)
        blocks = torch.cat([self.down_proj(self._gated(rows), reduce=False) for rows in x.split(_CPU_MLP_ROWS)])
        return all_reduce(blocks) if reduce else blocks  # one collective for the whole step, not one per block

    def _gated(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.gate_up_proj(x))


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """transformers' activation of that name (a vision tower's). Imported when a tower is built: the module pulls in
    transformers' modeling stack, which an engine serving text never needs (every process that imports the engine
    would pay for it)."""
    from transformers.activations import ACT2FN

    return ACT2FN[name]
