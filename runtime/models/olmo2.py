"""OLMo 2: norms after the attention and the MLP (before each joins the residual stream) and none before them,
and q/k norms over the whole projection (every head at once) rather than per head."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import tp_size
from runtime.errors import InvalidInputError
from runtime.models.decoder import Attention, CausalLM, head_dim_of
from runtime.models.layers import RMSNorm, ShardedRMSNorm


class Olmo2Attention(Attention):
    def __init__(self, config: PretrainedConfig, qkv_bias: bool, o_bias: bool, window: int | None):
        super().__init__(config, qkv_bias, o_bias, None, window)
        if self.num_kv_heads * tp_size() != config.num_key_value_heads:
            raise InvalidInputError("tensor_parallel_size", f"OLMo 2's k norm spans every KV head: "
                                    f"{config.num_key_value_heads} of them cannot be split over {tp_size()} ranks")
        head_dim = head_dim_of(config)
        self.q_norm = ShardedRMSNorm(config.num_attention_heads * head_dim, config.rms_norm_eps)
        self.k_norm = ShardedRMSNorm(config.num_key_value_heads * head_dim, config.rms_norm_eps)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q.flatten(1)).view_as(q), self.k_norm(k.flatten(1)).view_as(k)


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, residual, cos_sin, meta):
        stream = hidden if residual is None else hidden + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(stream, cos_sin, meta))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Olmo2Attention(config, *self.attention_biases(config), window)

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return Olmo2DecoderLayer(config, attention, mlp)
