"""Llama 4 (text): three layers of four attend within chunks of `attention_chunk_size` positions
(`runtime.layers.chunked_attention`) with rotary embedding over interleaved pairs and an L2 norm on q and k; the
fourth attends to everything without RoPE, its queries scaled up with the position (`attn_temperature_tuning`).
Every `interleave_moe_layer_step`-th layer is a mixture of experts: a top-k router whose sigmoid score scales the
expert's input (not its output), beside an ungated shared expert; the others are dense MLPs of
`intermediate_size_mlp`. The checkpoints as published hold a vision tower beside it (`llama4_vl`)."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import all_reduce
from runtime.errors import InvalidInputError
from runtime.layers.attention import Attention
from runtime.layers.linear import ReplicatedLinear
from runtime.layers.mlp import MLP
from runtime.layers.moe import FusedExperts
from runtime.models.decoder import DecoderModel, MoeCausalLM


class L2Norm(nn.Module):
    """RMSNorm without a weight, in float32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


class AttentionTemperature(nn.Module):
    """The NoPE layers' query scale at each position p: log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1;
    it takes a rotary table's place in the model (one value per position instead of cos and sin)."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.floor_scale, self.attn_scale = config.floor_scale, config.attn_scale

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0


class Llama4Attention(Attention):
    cuda_graphs = False  # a step's chunked pieces are cut on the host

    def __init__(self, config: PretrainedConfig, layer: int):
        rope = bool(config.no_rope_layers[layer])
        bias = bool(config.attention_bias)
        # transformers norms q and k after rotating them: rotation keeps each head's norm, so the order is moot
        super().__init__(config, bias, bias, L2Norm if config.use_qk_norm and rope else None, rope=rope,
                         interleaved=True)
        self.chunked = config.layer_types[layer] == "chunked_attention"
        self.temperature = not rope and config.attn_temperature_tuning

    def forward(self, hidden: torch.Tensor, cos_sin, meta) -> torch.Tensor:
        meta = meta.chunked if self.chunked else meta.full
        if not self.temperature:
            return super().forward(hidden, cos_sin, meta)
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([self.num_heads * self.head_dim, kv_size, kv_size], dim=-1)
        q = (q.reshape(-1, self.num_heads, self.head_dim) * cos_sin[:, None, None]).to(q.dtype)
        return self.o_proj(self.attend(q, k, v, None, meta))


class Llama4Experts(FusedExperts):
    """Llama 4 saves its experts input-major ([E, H, 2 I] and [E, I, H]), the transpose of what
    `FusedExperts` reads."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, expert: int | None = None,
                      half: int | None = None) -> None:
        if expert is None:  # the whole stack: as `FusedExperts` reads it
            loaded = loaded.transpose(1, 2)
        super().weight_loader(param, loaded, expert, half)


class Llama4Moe(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = ReplicatedLinear(config.hidden_size, config.num_local_experts, bias=False)
        self.experts = Llama4Experts(config.num_local_experts, config.hidden_size, config.intermediate_size)
        self.shared_expert = MLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        scores = torch.sigmoid(top.float()).to(x.dtype)
        ones = torch.ones_like(scores[:, :1], dtype=torch.float32)
        out = self.shared_expert(x, reduce=False)
        for j in range(self.top_k):  # each chosen expert sees the token scaled by its score
            out = out + self.experts(x * scores[:, j : j + 1], ones, ids[:, j : j + 1])
        return all_reduce(out)


class Llama4Model(DecoderModel):
    def __init__(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int):
        super().__init__(config, layers, max_positions)
        for i in self.stage_layers:
            if layers[i].self_attn.temperature:
                self.rope_keys[i] = "temperature"
                self.rotary["temperature"] = AttentionTemperature(config)


class Llama4ForCausalLM(MoeCausalLM):
    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        if "chunked_attention" in config.layer_types:
            self.attention_chunk_size = config.attention_chunk_size

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if "chunked_attention" in config.layer_types and not config.attention_chunk_size:
            raise InvalidInputError("model", "chunked attention layers without an attention_chunk_size")

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Llama4Attention(config, layer)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if layer in config.moe_layers:
            return Llama4Moe(config)
        return MLP(config.hidden_size, config.intermediate_size_mlp)

    def make_model(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int) -> DecoderModel:
        return Llama4Model(config, layers, max_positions)

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        return super().param_for(name.replace(".feed_forward.", ".mlp."))

