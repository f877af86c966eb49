"""Adapter slots on the model's projections, and the per-step map of tokens to slots.

Each projection (fused q/k/v, o, fused gate/up, down) gets `A` [slots, R, in]
and `B` [slots, out, R], where R is the rank limit times the number of
projections fused in it: a fused projection's parts each own R/parts columns
of B, on their own rows, so one product serves all parts. A slot's unused
rank is zeros, which add nothing. Tensor parallelism shards the slots the way
the base weight is sharded: B's rows on column-parallel projections, A's
columns on row-parallel ones (whose partial sums are reduced with the base's).

A step's tokens are grouped by slot once (`LoRABatch`); every projection then
adds, per group, `(x A^T) B^T` for that group's rows: one pair of matmuls per
adapter in the batch, never a forward per adapter.
"""

from dataclasses import dataclass

import torch
from torch import nn

from kernels import tensor_on
from runtime.distributed import tp_rank, tp_size
from runtime.lora.adapter import LoRAAdapter


class LoRABatch:
    """How the current step's rows use the adapter slots, planned once per step for every projection.

    The usual plan is one batched product for all adapters: the rows of each adapter in the step, padded to
    the longest group, go through `bmm` with their slots' A and B stacked (so a step costs the same few ops
    whatever the number of adapters). When padding would more than double the rows (a long prefill beside
    a few decodes), each group runs on its own instead.
    """

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor | None]] = []  # (slot, its rows, or None for all): the loop
        self.stacked = None  # (slots, index [G, L], rows, valid) for the batched product

    def set(self, seq_slots: list[int], query_lens: list[int], device: torch.device) -> None:
        members: dict[int, list[int]] = {}  # slot -> its rows of the flattened batch, in one pass over sequences
        offset = 0
        for slot, n in zip(seq_slots, query_lens):
            members.setdefault(slot, []).extend(range(offset, offset + n))
            offset += n
        base = members.pop(-1, None)
        members = dict(sorted(members.items()))
        distinct = list(members)
        self.stacked = None
        if len(distinct) == 1 and base is None:
            self.groups = [(distinct[0], None)]
            return
        longest = max((len(rows) for rows in members.values()), default=0)
        used = sum(len(rows) for rows in members.values())
        if len(distinct) > 1 and len(distinct) * longest <= 2 * used:
            index = [rows + [rows[0]] * (longest - len(rows)) for rows in members.values()]  # pad with a real row
            valid = [g * longest + i for g, rows in enumerate(members.values()) for i in range(len(rows))]
            rows = [row for group in members.values() for row in group]
            self.stacked = (tensor_on(distinct, torch.long, device), tensor_on(index, torch.long, device),
                            tensor_on(rows, torch.long, device),
                            None if used == len(distinct) * longest else tensor_on(valid, torch.long, device))
            self.groups = []
            return
        self.groups = [(s, tensor_on(rows, torch.long, device)) for s, rows in members.items()]


@dataclass(frozen=True)
class Part:
    """One projection of a fused weight: its PEFT module name, and its rows in this rank's output."""

    module: str
    offset: int
    size: int
    shard: int  # which shard of the full rows this rank holds


class LoRAWeights(nn.Module):
    def __init__(self, parts: list[Part], in_features: int, input_shard: int | None, slots: int, max_rank: int,
                 batch: LoRABatch, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.parts, self.max_rank, self.batch = parts, max_rank, batch
        self.input_shard = input_shard  # row-parallel: which slice of the input features this rank holds
        out = sum(p.size for p in parts)
        self.register_buffer("a", torch.zeros(slots, max_rank * len(parts), in_features, dtype=dtype, device=device))
        self.register_buffer("b", torch.zeros(slots, out, max_rank * len(parts), dtype=dtype, device=device))

    def load(self, slot: int, layer: int, adapter: LoRAAdapter) -> None:
        """Write this layer's part of `adapter` into `slot` (zeros where it has no weights)."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        in_features = self.a.shape[2]
        for j, part in enumerate(self.parts):
            pair = adapter.weights.get((layer, part.module))
            if pair is None:
                continue
            a, b = pair
            if self.input_shard is not None:
                a = a[:, self.input_shard * in_features : (self.input_shard + 1) * in_features]
            b = b[part.shard * part.size : (part.shard + 1) * part.size]
            cols = slice(j * self.max_rank, j * self.max_rank + adapter.rank)
            self.a[slot, cols] = a.to(self.a.dtype)
            self.b[slot, part.offset : part.offset + part.size, cols] = b.to(self.b.dtype)

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.batch.stacked is not None:
            slots, index, rows, valid = self.batch.stacked
            shrunk = torch.bmm(x[index], self.a[slots].transpose(1, 2))  # [adapters, rows, R]
            delta = torch.bmm(shrunk, self.b[slots].transpose(1, 2)).flatten(0, 1)
            return out.index_add_(0, rows, delta if valid is None else delta[valid])
        for slot, rows in self.batch.groups:
            if rows is None:
                out += (x @ self.a[slot].T) @ self.b[slot].T
            else:
                out.index_add_(0, rows, (x[rows] @ self.a[slot].T) @ self.b[slot].T)
        return out


def attach_lora(model: nn.Module, slots: int, max_rank: int, dtype: torch.dtype, device: torch.device) -> LoRABatch:
    """Give every decoder projection its adapter slots; returns the batch map they all read."""
    batch, rank, tp = LoRABatch(), tp_rank(), tp_size()

    def weights(parts: list[Part], in_features: int, input_shard: int | None = None) -> LoRAWeights:
        return LoRAWeights(parts, in_features, input_shard, slots, max_rank, batch, dtype, device)

    for i in model.model.stage_layers:
        layer = model.model.layers[i]
        qkv, o = layer.self_attn.qkv_proj, layer.self_attn.o_proj
        q_size, kv_size = qkv.num_heads * qkv.head_dim, qkv.num_kv_heads * qkv.head_dim
        kv_shard = rank // qkv.kv_replicas
        qkv.lora = weights([Part("q_proj", 0, q_size, rank), Part("k_proj", q_size, kv_size, kv_shard),
                            Part("v_proj", q_size + kv_size, kv_size, kv_shard)], qkv.matrix_shape[1])
        o.lora = weights([Part("o_proj", 0, o.matrix_shape[0], 0)], o.matrix_shape[1], input_shard=rank)
        gate_up, down = layer.mlp.gate_up_proj, layer.mlp.down_proj
        size = gate_up.out_features[0] // tp
        gate_up.lora = weights([Part("gate_proj", 0, size, rank), Part("up_proj", size, size, rank)],
                               gate_up.matrix_shape[1])
        down.lora = weights([Part("down_proj", 0, down.matrix_shape[0], 0)], down.matrix_shape[1], input_shard=rank)
    return batch


def load_into_slot(model: nn.Module, slot: int, adapter: LoRAAdapter) -> None:
    for i in model.model.stage_layers:
        layer = model.model.layers[i]
        for projection in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                           layer.mlp.down_proj):
            projection.lora.load(slot, i, adapter)
