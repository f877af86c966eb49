"""Gated DeltaNet, the linear-attention layer of Qwen3-Next's hybrid stack: projections to q, k, v, an output
gate z and the per-head b (the update's strength) and a (the decay's step), a short causal convolution over q, k, v,
the gated delta rule (`kernels.gated_delta`) against each sequence's recurrent state, a gated RMSNorm per head, and
the output projection.

Checkpoints lay the projections out two ways: Qwen3-Next fuses q, k, v, z in one tensor and b, a in another,
key head by key head (each with its group of value heads); Qwen3.5 keeps q, k, v (all q, then all k, then all v),
z, b and a in tensors of their own, which load into the same two fused projections part by part (`grouped` False).
Tensor parallel splits the key heads, each with its value heads, across ranks: a contiguous slice of a grouped
projection, a slice of each part otherwise; the convolution's channels (all q, then all k, then all v) are sliced
per part.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from kernels.gated_delta import causal_conv1d, gated_delta_rule
from runtime.distributed import tp_rank, tp_size
from runtime.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
    default_weight_loader,
    head_parameter,
)
from runtime.layers.state_cache import StatefulLayer


class GatedRMSNorm(nn.Module):
    """RMSNorm of each head's output (in float32), times SiLU of the gate z."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


class ShardedDepthwiseConv(nn.Module):
    """The convolution's weight [channels/tp, width]: the checkpoint's [channels, 1, width], whose channels are the
    concatenated `parts` (q, k, v), each split across ranks."""

    def __init__(self, parts: list[int], width: int):
        super().__init__()
        self.parts = parts
        self.weight = nn.Parameter(torch.empty(sum(parts) // tp_size(), width), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        shards = [part.narrow(0, tp_rank() * (size // tp_size()), size // tp_size())
                  for part, size in zip(loaded.squeeze(1).split(self.parts), self.parts)]
        param.data.copy_(torch.cat(shards))


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(StatefulLayer):
    def __init__(self, config: PretrainedConfig, grouped: bool = True):
        super().__init__()
        self.grouped = grouped
        tp = tp_size()
        self.num_k_heads = config.linear_num_key_heads // tp
        self.num_v_heads = config.linear_num_value_heads // tp
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.group = self.num_v_heads // self.num_k_heads  # value heads per key head
        key_dim = config.linear_num_key_heads * self.head_k_dim
        value_dim = config.linear_num_value_heads * self.head_v_dim
        self.conv_width = config.linear_conv_kernel_dim
        if grouped:
            self.in_proj_qkvz = ColumnParallelLinear(config.hidden_size, 2 * key_dim + 2 * value_dim)
            self.in_proj_ba = ColumnParallelLinear(config.hidden_size, 2 * config.linear_num_value_heads)
        else:
            self.in_proj_qkvz = MergedColumnParallelLinear(config.hidden_size, [key_dim, key_dim, value_dim, value_dim])
            self.in_proj_ba = MergedColumnParallelLinear(config.hidden_size, [config.linear_num_value_heads] * 2)
        self.conv1d = ShardedDepthwiseConv([key_dim, key_dim, value_dim], self.conv_width)
        self.A_log = head_parameter(self.num_v_heads)
        self.dt_bias = head_parameter(self.num_v_heads)
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_dim, config.hidden_size)

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        channels = self.conv1d.weight.shape[0]
        return {"conv": ((channels, self.conv_width - 1), self.conv1d.weight.dtype),
                "recurrent": ((self.num_v_heads, self.head_k_dim, self.head_v_dim), torch.float32)}

    def forward(self, hidden: torch.Tensor, cos_sin, meta) -> torch.Tensor:
        tokens, dk, dv, group = hidden.shape[0], self.head_k_dim, self.head_v_dim, self.group
        states, step = self.fresh_states(), self.step
        if self.grouped:  # per key head: its q, k, then its group's values and gates; then its group's b, then a
            q, k, v, z = self.in_proj_qkvz(hidden).view(tokens, self.num_k_heads, -1).split(
                [dk, dk, group * dv, group * dv], dim=-1)
            b, a = self.in_proj_ba(hidden).view(tokens, self.num_k_heads, -1).split([group, group], dim=-1)
        else:
            key_size, value_size = self.num_k_heads * dk, self.num_v_heads * dv
            q, k, v, z = self.in_proj_qkvz(hidden).split([key_size, key_size, value_size, value_size], dim=-1)
            b, a = self.in_proj_ba(hidden).split([self.num_v_heads] * 2, dim=-1)
        mixed = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=-1)
        mixed = causal_conv1d(mixed, self.conv1d.weight, states["conv"], step.slots, step.query_lens)
        q, k, v = mixed.split([self.num_k_heads * dk, self.num_k_heads * dk, self.num_v_heads * dv], dim=-1)
        q = l2_normalize(q.reshape(tokens, self.num_k_heads, dk).float()) * dk**-0.5
        k = l2_normalize(k.reshape(tokens, self.num_k_heads, dk).float())
        beta = b.reshape(tokens, self.num_v_heads).sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(a.reshape(tokens, self.num_v_heads).float() + self.dt_bias)
        out = gated_delta_rule(q, k, v.reshape(tokens, self.num_v_heads, dv).float(), g, beta, states["recurrent"],
                               step.slots, step.cu_seqlens)
        out = self.norm(out.to(hidden.dtype), z.reshape(tokens, self.num_v_heads, dv))
        return self.out_proj(out.reshape(tokens, -1))
