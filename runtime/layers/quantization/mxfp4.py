"""gpt-oss's experts as OpenAI publishes them: MXFP4, kept so in memory.

Each expert's matrices come as `*_blocks` (two FP4 e2m1 values a byte, 32 a block: [E, out, in / 32, 16]) and
`*_scales` (one E8M0 exponent a block, 2^(s - 127): [E, out, in / 32]), gate and up rows interleaved as in the
bf16 checkpoints; the biases unquantized. After loading, each expert's two projections become
`kernels.QuantizedWeight`s (FP4 codes, a float scale per row and block of 32 inputs), which the C++ kernel on
CPU and the Triton kernel on GPU dequantize tile by tile inside the product, run by `experts.ExpertLoop`.
"""

from collections.abc import Callable

import torch
from torch import nn

from kernels import QuantizedWeight
from runtime.distributed import tp_rank, tp_size
from runtime.errors import InvalidInputError
from runtime.layers.quantization.experts import ExpertLoop

BLOCK = 32  # inputs per scale (MX's block)


def gate_then_up(interleaved: torch.Tensor, dim: int) -> torch.Tensor:
    """gpt-oss's gate and up features, interleaved along `dim` (gate at even indices), as all gate then all up."""
    dim %= interleaved.dim()
    return torch.cat(interleaved.unflatten(dim, (-1, 2)).unbind(dim + 1), dim=dim)


class Mxfp4Experts(ExpertLoop):
    """E gated MLPs with biases, their weights MXFP4; this rank holds a slice of every expert's intermediate
    features (gate/up rows, down inputs), as `runtime.layers.moe.FusedExperts` does."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__(num_experts, activation)
        self.shard = intermediate_size // tp_size()
        if hidden_size % BLOCK or self.shard % BLOCK:
            raise InvalidInputError("model", f"MXFP4 experts need hidden and per-rank intermediate sizes in whole "
                                    f"blocks of {BLOCK}; got {hidden_size} and {self.shard}")
        shapes = {"gate_up_proj_blocks": (num_experts, 2 * self.shard, hidden_size // BLOCK, BLOCK // 2),
                  "gate_up_proj_scales": (num_experts, 2 * self.shard, hidden_size // BLOCK),
                  "down_proj_blocks": (num_experts, hidden_size, self.shard // BLOCK, BLOCK // 2),
                  "down_proj_scales": (num_experts, hidden_size, self.shard // BLOCK)}
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=torch.uint8), requires_grad=False))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * self.shard), requires_grad=False)
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden_size), requires_grad=False)
        for param in self.parameters():
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """The checkpoint's tensor for every expert: this rank's gate and up rows (de-interleaved), or its slice
        of down's input blocks; down's bias on rank 0 only (the ranks' partial sums are added)."""
        start = tp_rank() * self.shard
        if param is self.down_proj_bias:
            loaded = loaded if tp_rank() == 0 else torch.zeros_like(loaded)
        elif param is self.down_proj_blocks or param is self.down_proj_scales:
            loaded = loaded[:, :, start // BLOCK : (start + self.shard) // BLOCK]
        else:  # gate_up blocks, scales or bias
            gate, up = gate_then_up(loaded, 1).chunk(2, dim=1)
            loaded = torch.cat([gate[:, start : start + self.shard], up[:, start : start + self.shard]], dim=1)
        param.data.copy_(loaded)

    def pack(self) -> None:
        """After loading: each expert's projections as `QuantizedWeight`s, the loading parameters dropped."""
        for blocks, scales, into in [(self.gate_up_proj_blocks, self.gate_up_proj_scales, self.gate_up),
                                     (self.down_proj_blocks, self.down_proj_scales, self.down)]:
            for e in range(self.num_experts):
                codes = blocks.data[e].reshape(blocks.shape[1], -1)
                scale = torch.exp2(scales.data[e].float() - 127)
                into.append(QuantizedWeight.build(codes, "float", 4, scale, None))
        for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"):
            delattr(self, name)
