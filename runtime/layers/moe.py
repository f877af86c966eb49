"""The sparse mixture-of-experts block: a top-k router, stacked expert weights, an optional shared expert.

The experts run as one grouped product per projection (`kernels.fused_experts`). Every rank holds a slice of
every expert's intermediate features (as the dense MLP splits its own), or, under expert parallelism
(`enable_expert_parallel`), whole experts, E / tp of them: each rank runs the (token, expert) pairs of its own
experts (every rank has every token), so the tokens go to the rank of their expert and come back in the same
all-reduce of the block's partial sums.
"""

from collections.abc import Callable

import torch
from torch import nn

from kernels import fused_experts, silu_and_mul
from kernels.cpu import grouped_matmul as cpu_grouped
from runtime.distributed import all_reduce, expert_parallel, tp_rank, tp_size
from runtime.errors import InvalidInputError
from runtime.layers.linear import ReplicatedLinear
from runtime.layers.mlp import MLP


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (in float32), then the top k: their weights (summing to 1 if `renormalize`)
    and ids, each [T, top_k]."""
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class FusedExperts(nn.Module):
    """E gated MLPs (SiLU, or another `activation` of [T, 2 I] gate then up) as stacked parameters, stored
    input-major so each expert's matrix is contiguous as the grouped product reads it (a transposed view is
    far slower): `gate_up_proj` [E, H, 2 I/tp] (gate then up) and `down_proj` [E, I/tp, H];
    with `bias`, `gate_up_proj_bias` [E, 2 I/tp] and `down_proj_bias` [E, H] (added once, on rank 0). Under
    expert parallelism the rank's E/tp experts whole: [E/tp, H, 2 I], [E/tp, I, H], each bias where its expert
    is. After loading, `pack` may replace both matrices with the CPU kernel's packed copies."""

    packed: tuple[torch.Tensor, torch.Tensor] | None = None

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, bias: bool = False,
                 activation: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul):
        super().__init__()
        self.num_experts = num_experts
        self.activation = activation
        self.local, self.first, self.shard, self.start = num_experts, 0, intermediate_size // tp_size(), 0
        if expert_parallel():
            if num_experts % tp_size():
                raise InvalidInputError("enable_expert_parallel", f"{num_experts} experts do not split evenly over "
                                        f"{tp_size()} ranks")
            self.local, self.shard = num_experts // tp_size(), intermediate_size
            self.first = tp_rank() * self.local
            self.cuda_graphs = False  # the rank's pairs are counted on the host
        else:
            self.start = tp_rank() * self.shard
        self.gate_up_proj = nn.Parameter(torch.empty(self.local, hidden_size, 2 * self.shard), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(self.local, self.shard, hidden_size), requires_grad=False)
        self.gate_up_proj_bias = self.down_proj_bias = None
        if bias:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(self.local, 2 * self.shard), requires_grad=False)
            self.down_proj_bias = nn.Parameter(torch.empty(self.local, hidden_size), requires_grad=False)
        for param in self.parameters():
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, expert: int | None = None,
                      half: int | None = None) -> None:
        """Load one expert's projection (`half` 0: gate, 1: up; None for down), or, with no expert, a fused
        checkpoint tensor holding every expert ([E, 2 I, H] gate then up, or [E, H, I]; biases [E, 2 I] gate then
        up, or [E, H])."""
        start, mine = self.start, slice(self.first, self.first + self.local)
        if param is self.down_proj_bias and self.local == self.num_experts and tp_rank() > 0:
            param.data.zero_()  # sharded experts: added by rank 0 alone
        elif param is self.down_proj_bias:
            param.data.copy_(loaded[mine])
        elif param is self.gate_up_proj_bias:
            for h, part in enumerate(loaded[mine].chunk(2, dim=-1)):
                param.data[:, h * self.shard : (h + 1) * self.shard].copy_(part[:, start : start + self.shard])
        elif expert is None:
            for e in range(self.num_experts):
                if param is self.down_proj:
                    self.weight_loader(param, loaded[e], e)
                else:
                    for h, part in enumerate(loaded[e].chunk(2)):
                        self.weight_loader(param, part, e, h)
        elif not self.first <= expert < self.first + self.local:  # another rank's expert
            return
        elif param is self.down_proj:
            param.data[expert - self.first].copy_(loaded[:, start : start + self.shard].T)
        else:
            param.data[expert - self.first, :, half * self.shard : (half + 1) * self.shard].copy_(
                loaded[start : start + self.shard].T)

    def pack(self) -> None:
        """Give both matrices the layout of the CPU grouped product (`kernels.cpu.grouped_matmul`) where it serves
        them, dropping the plain copies."""
        packed = cpu_grouped.pack(self.gate_up_proj), cpu_grouped.pack(self.down_proj)
        if all(p is not None for p in packed):
            self.packed = packed
            self.gate_up_proj = self.down_proj = None

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the weighted experts' outputs for tokens `x` [T, H] routed to `ids`."""
        if self.local == self.num_experts:
            return self._run(x, weights, ids)
        ids = ids - self.first
        tokens, slots = ((ids >= 0) & (ids < self.local)).nonzero(as_tuple=True)  # the pairs of this rank's experts
        out = torch.zeros_like(x)
        if tokens.numel():
            out.index_add_(0, tokens, self._run(x[tokens], weights[tokens, slots, None], ids[tokens, slots, None]))
        return out

    def _run(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return fused_experts(x, weights, ids, self.gate_up_proj, self.down_proj, self.activation,
                             self.gate_up_proj_bias, self.down_proj_bias, self.packed)


class SparseMoeBlock(nn.Module):
    """Router + experts (+ a shared expert behind a sigmoid gate, as Qwen2-MoE has). A family whose experts
    differ passes its own `experts`; `router_bias` puts a bias on the router."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int, renormalize: bool,
                 shared_intermediate_size: int = 0, experts: FusedExperts | None = None, router_bias: bool = False):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=router_bias)
        self.experts = experts or FusedExperts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate_size:
            self.shared_expert = MLP(hidden_size, shared_intermediate_size)
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, reduce=False)
        return all_reduce(out)


