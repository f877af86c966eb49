"""Tensor-parallel-aware layers, each with a `weight_loader` that takes this rank's shard.

Column-parallel layers split their output features across ranks, row-parallel
layers split their input features and all-reduce the result, the vocabulary
embedding and LM head split the vocabulary. At TP=1 they are plain layers.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernels import QuantizedWeight, linear, pack_weight
from runtime.distributed import all_gather_last_dim, all_reduce, tp_rank, tp_size


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def shard(loaded: torch.Tensor, dim: int, size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s slice, `size` wide, of a checkpoint tensor along `dim`."""
    return loaded.narrow(dim, rank * size, size)


def pack_linear_weights(model: nn.Module) -> None:
    """After loading: give every projection, and every MoE layer's experts (modules with a `pack` method), the
    device's packed weight layout, where it has one.

    The packed copy replaces the plain weight (a tied embedding keeps its own reference).
    """
    for module in model.modules():
        if isinstance(module, _Projection) and module.weight is not None:  # a quantized one has its own layout
            module.packed = pack_weight(module.weight)
            if module.packed is not None:
                module.weight = None
        elif callable(getattr(module, "pack", None)):
            module.pack()


class _Projection:
    """A module whose `weight` multiplies its input: through the packed copy once there is one, plus the
    step's LoRA adapters when the engine serves them (`runtime.lora.layers`)."""

    packed: torch.Tensor | None = None
    quantized: QuantizedWeight | None = None  # a quantized checkpoint's weight (runtime.layers.quantization)
    quantize_input: Callable[[torch.Tensor], torch.Tensor] | None = None  # its input's quantization (W8A8)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is None:
            out = linear(x, self.weight, self.bias, self.packed)
        else:
            out = self.quantized.matmul(x if self.quantize_input is None else self.quantize_input(x), self.bias)
        return out if self.lora is None else self.lora.add_to(out, x)


class _Linear(_Projection, nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.matrix_shape = (out_features, in_features)  # this rank's, kept once a packed copy replaces `weight`
        self.lora = None  # the adapter slots (runtime.lora.layers), when the engine serves LoRA
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)


class ColumnParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features // tp_size(), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(shard(loaded, 0, param.shape[0], tp_rank()))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (gate and up)."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool = False):
        self.out_features = out_features
        super().__init__(in_features, sum(out_features), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | tuple[int, ...] | None = None
                      ) -> None:
        """Load projection `shard_id`, the consecutive projections of a tuple from a checkpoint tensor holding
        them fused (Qwen3.5's q, k and v), or all of them from one that holds every one (Phi-3's gate and up)."""
        if not isinstance(shard_id, int):
            ids = range(len(self.out_features)) if shard_id is None else shard_id
            for i, part in zip(ids, loaded.split([self.out_features[i] for i in ids])):
                self.weight_loader(param, part, i)
            return
        size = self.out_features[shard_id] // tp_size()
        offset = sum(self.out_features[:shard_id]) // tp_size()
        param.data.narrow(0, offset, size).copy_(shard(loaded, 0, size, tp_rank()))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q, k, v projections; KV heads are replicated when ranks outnumber them."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool):
        tp = tp_size()
        self.head_dim = head_dim
        self.num_heads = num_heads // tp
        self.num_kv_heads = max(1, num_kv_heads // tp)
        self.kv_replicas = max(1, tp // num_kv_heads)
        self.checkpoint_sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden, out, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        """Load projection `shard_id` ("q", "k" or "v"), or all three from a fused checkpoint tensor (Phi-3)."""
        if shard_id is None:
            for part, name in zip(loaded.split(self.checkpoint_sizes), "qkv"):
                self.weight_loader(param, part, name)
            return
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, rank = 0, q_size, tp_rank()
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, rank = kv_size, tp_rank() // self.kv_replicas
        param.data.narrow(0, offset, size).copy_(shard(loaded, 0, size, rank))


class ReplicatedLinear(_Linear):
    """A projection every rank holds whole (an MoE router, the shared expert's gate)."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        default_weight_loader(param, loaded)


class RowParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features // tp_size(), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # the bias is added once, on rank 0
            param.data.copy_(loaded if tp_rank() == 0 else torch.zeros_like(loaded))
        else:
            param.data.copy_(shard(loaded, 1, param.shape[1], tp_rank()))

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """This rank's partial sum, all-reduced unless the caller reduces several blocks at once."""
        partial = super().forward(x)
        return all_reduce(partial) if reduce else partial


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // tp_size())
        self.start = self.shard_size * tp_rank()
        self.weight = nn.Parameter(torch.zeros(self.shard_size, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rows = loaded[self.start : self.start + self.shard_size]
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * inside.unsqueeze(-1)
        return all_reduce(out)


class ParallelLMHead(_Projection, VocabParallelEmbedding):
    bias = None
    lora = None  # adapters never target the LM head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last_dim(self.project(hidden))
        return logits[..., : self.vocab_size]


def head_parameter(num_heads: int) -> nn.Parameter:
    """One value per attention head of this rank (gpt-oss's sinks), loaded from the checkpoint's all-heads tensor."""
    param = nn.Parameter(torch.empty(num_heads), requires_grad=False)
    param.weight_loader = lambda p, loaded: p.data.copy_(shard(loaded, 0, p.shape[0], tp_rank()))
    return param


