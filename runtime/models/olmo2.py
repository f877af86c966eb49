"""OLMo 2 and 3: norms after the attention and the MLP (before each joins the residual stream) and none before
them, and q/k norms over the whole projection (cross_head_norm.py); OLMo 3 slides on most layers."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.layers.cross_head_norm import CrossHeadNormAttention
from runtime.layers.norms import RMSNorm
from runtime.models.decoder import CausalLM


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
        return CrossHeadNormAttention(config, *self.attention_biases(config), window)

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return Olmo2DecoderLayer(config, attention, mlp)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3: OLMo 2's layers, three of every four sliding (`layer_types`), each layer type with its own rotary
    parameters."""
