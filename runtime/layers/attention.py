"""A decoder layer's attention: q/k/v projections, optional per-head q/k norms, rotary embeddings, the attention
backend over the paged KV cache (with a sliding window, score soft cap or sinks where the layer has them), the
output projection."""

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import AttentionMetadata, apply_rotary
from runtime.layers.linear import QKVParallelLinear, RowParallelLinear, head_parameter
from runtime.layers.rotary import deinterleave_pairs


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    """Self-attention over the paged cache. Beyond the plain layer: a sliding `window`, a `scale` other than
    head_dim ** -0.5, soft-capped scores (`softcap`), per-head q/k norms of class `qk_norm`, learned
    per-head attention `sinks` (gpt-oss), no rotary embedding (`rope` False: SmolLM3's NoPE layers), a
    rotary embedding over interleaved pairs (`interleaved`: ERNIE), and an output gate per head that the query
    projection computes beside each query (`gated`: Qwen3-Next, the sigmoid of it scales the head's output)."""

    kv_planes = 2  # the KV cache's planes: keys, values

    def __init__(self, config: PretrainedConfig, qkv_bias: bool, o_bias: bool, qk_norm: type[nn.Module] | None,
                 window: int | None = None, scale: float | None = None, softcap: float | None = None,
                 sinks: bool = False, rope: bool = True, interleaved: bool = False, gated: bool = False):
        super().__init__()
        head_dim = head_dim_of(config)
        self.gated = gated
        q_heads = config.num_attention_heads * (2 if gated else 1)  # a gate beside each query head
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, q_heads, config.num_key_value_heads, qkv_bias)
        self.num_heads = self.qkv_proj.num_heads // (2 if gated else 1)
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.scale = scale or head_dim**-0.5
        self.window, self.softcap, self.rope, self.interleaved = window, softcap, rope, interleaved
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size, o_bias)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = qk_norm(head_dim, config.rms_norm_eps)
            self.k_norm = qk_norm(head_dim, config.rms_norm_eps)
        self.sinks = head_parameter(self.num_heads) if sinks else None
        self.k_cache = self.v_cache = torch.empty(0)  # bound by the model runner

    def forward(self, hidden: torch.Tensor, cos_sin, meta: AttentionMetadata) -> torch.Tensor:
        """Attention runs on the backend that built `meta`, reached through it: metadata is only readable by
        its own backend, so pairing them in one object rules out a mismatch, and the forward pass (a CUDA
        graph's captured one included) needs no backend bound to each layer."""
        kv_size = self.num_kv_heads * self.head_dim
        if not self.gated:
            q, k, v = self.qkv_proj(hidden).split([self.num_heads * self.head_dim, kv_size, kv_size], dim=-1)
            return self.o_proj(self.attend(q.reshape(-1, self.num_heads, self.head_dim), k, v, cos_sin, meta))
        q_gate, k, v = self.qkv_proj(hidden).split([2 * self.num_heads * self.head_dim, kv_size, kv_size], dim=-1)
        q, gate = q_gate.reshape(-1, self.num_heads, 2, self.head_dim).unbind(2)  # per head: its query, its gate
        out = self.attend(q.contiguous(), k, v, cos_sin, meta)
        return self.o_proj(out * torch.sigmoid(gate.reshape(out.shape)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_sin, meta: AttentionMetadata
               ) -> torch.Tensor:
        """The attention output [T, heads x head_dim] of q [T, heads, head_dim] and the new tokens' k and v
        (each [T, kv_heads x head_dim]): norms and rotary embedding applied, k and v stored in the cache."""
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.norm_qk(q, k)
        if self.rope:
            q, k = rotate(q, k, *cos_sin, self.interleaved)
        meta.backend.store_kv(k, v, self.k_cache, self.v_cache, meta)
        out = meta.backend.attend(q, self.k_cache, self.v_cache, meta, self.scale, self.window, self.softcap,
                                  self.sinks)
        if meta.pictures is not None:
            meta.pictures.attend(out, q, self.k_cache, self.v_cache, self.scale, self.window, self.softcap, self.sinks)
        return out.reshape(-1, self.num_heads * self.head_dim)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, heads, head_dim] and k [T, kv_heads, head_dim] after their norms (none, or per head)."""
        if self.q_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)


def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding over each head's first 2 x cos.shape[-1] features (all of them but where the model's
    `partial_rotary_factor` is below 1), as halves or as `interleaved` pairs; the rest pass as they are."""
    rotated = 2 * cos.shape[-1]
    if rotated == q.shape[-1] and not interleaved:
        return apply_rotary(q, k, cos, sin)
    q_rot, k_rot = q[..., :rotated], k[..., :rotated]
    if interleaved:
        q_rot, k_rot = deinterleave_pairs(q_rot), deinterleave_pairs(k_rot)
    q_rot, k_rot = apply_rotary(q_rot.contiguous(), k_rot.contiguous(), cos, sin)
    return torch.cat([q_rot, q[..., rotated:]], dim=-1), torch.cat([k_rot, k[..., rotated:]], dim=-1)
