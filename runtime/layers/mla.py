"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): the KV cache holds, per token, the compressed latent
(`kv_lora_rank`) and the rotary part of the key (`qk_rope_head_dim`), both shared by every head, rather than
per-head K and V.

The projections are absorbed, as the peers do in decode: each head's query is taken into the latent space
through its slice of `kv_b_proj` (W_UK), so attention runs as a single KV head of size kv_lora_rank +
qk_rope_head_dim over the cache as stored, through whichever attention backend the engine runs. Keys and
values are one cache plane (a value is the latent part of a key); the output's latent part leaves through each
head's W_UV slice.
"""

import math

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import AttentionMetadata, apply_rotary
from runtime.distributed import tp_rank, tp_size
from runtime.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from runtime.layers.norms import RMSNorm
from runtime.layers.rotary import deinterleave_pairs

_LATENT_NORM_EPS = 1e-6  # transformers' DeepSeek normalises the q and kv latents with its RMSNorm's default


def latent_cache_head_dim(config: PretrainedConfig) -> int:
    return config.kv_lora_rank + config.qk_rope_head_dim


def softmax_scale(config: PretrainedConfig) -> float:
    """qk_head_dim ** -0.5, times YaRN's mscale squared where the rope parameters set `mscale_all_dim`."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim") and rope["factor"] > 1:
        mscale = 0.1 * rope["mscale_all_dim"] * math.log(rope["factor"]) + 1.0
        scale *= mscale * mscale
    return scale


class LatentUpProjection(nn.Module):
    """`kv_b_proj` as the checkpoint holds it ([heads x (qk_nope + v), kv_lora_rank], this rank's heads), kept
    as it is: attention reads each head's two slices (W_UK, W_UV) rather than projecting the latent."""

    dequantized_at_load = True  # from a quantized checkpoint (runtime.layers.quantization): read whole, not projected

    def __init__(self, num_heads: int, nope: int, v: int, rank: int):
        super().__init__()
        self.num_heads, self.nope, self.v = num_heads // tp_size(), nope, v
        self.checkpoint_shape = (num_heads * (nope + v), rank)
        self.weight = nn.Parameter(torch.empty(self.num_heads * (nope + v), rank), requires_grad=False)
        self.weight.weight_loader = lambda p, loaded: p.data.copy_(loaded.narrow(0, tp_rank() * p.shape[0],
                                                                                 p.shape[0]))

    def halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [heads, qk_nope, rank] and W_UV [heads, v, rank]."""
        w = self.weight.view(self.num_heads, self.nope + self.v, -1)
        return w[:, : self.nope], w[:, self.nope :]


class LatentAttention(nn.Module):
    kv_planes = 1  # keys and values share the cache: the model runner binds v_cache to k_cache
    num_kv_heads = 1

    def __init__(self, config: PretrainedConfig, interleaved: bool | None = None):
        """`interleaved`: rotary pairs (x0, x1), (x2, x3), ...; by default as the config's `rope_interleave`."""
        super().__init__()
        heads, hidden, bias = config.num_attention_heads, config.hidden_size, bool(config.attention_bias)
        self.num_heads = heads // tp_size()
        self.nope, self.rope, self.v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.rank = config.kv_lora_rank
        self.head_dim = latent_cache_head_dim(config)
        qk_head = self.nope + self.rope
        self.q_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if config.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(hidden, config.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, _LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(config.q_lora_rank, heads * qk_head)
        else:
            self.q_proj = ColumnParallelLinear(hidden, heads * qk_head)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.rank + self.rope, bias)
        self.kv_a_layernorm = RMSNorm(self.rank, _LATENT_NORM_EPS)
        self.kv_b_proj = LatentUpProjection(heads, self.nope, self.v, self.rank)
        self.o_proj = RowParallelLinear(heads * self.v, hidden, bias)
        self.scale = softmax_scale(config)
        self.interleaved = bool(getattr(config, "rope_interleave", False) if interleaved is None else interleaved)
        self.k_cache = self.v_cache = torch.empty(0)  # bound by the model runner

    def forward(self, hidden: torch.Tensor, cos_sin, meta: AttentionMetadata) -> torch.Tensor:
        if self.q_proj is not None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(-1, self.num_heads, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())
        q_pe, k_pe = q_pe.contiguous(), k_pe.reshape(-1, 1, self.rope)
        if self.interleaved:
            q_pe, k_pe = deinterleave_pairs(q_pe), deinterleave_pairs(k_pe)
        q_pe, k_pe = apply_rotary(q_pe, k_pe, *cos_sin)
        w_uk, w_uv = self.kv_b_proj.halves()
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        key = torch.cat([latent[:, None, :], k_pe], dim=-1)
        meta.backend.store_kv(key, key, self.k_cache, self.v_cache, meta)
        out = meta.backend.attend(torch.cat([q_latent, q_pe], dim=-1), self.k_cache, self.v_cache, meta,
                                  self.scale)
        values = torch.einsum("thr,hvr->thv", out[..., : self.rank], w_uv)
        return self.o_proj(values.reshape(-1, self.num_heads * self.v))
