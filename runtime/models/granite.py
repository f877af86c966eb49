"""Granite: Llama's layers with its multipliers: the embeddings scaled by `embedding_multiplier`, attention
scores by `attention_multiplier` (in place of head_dim ** -0.5), each layer's attention and MLP outputs by
`residual_multiplier` before they join the residual stream, and the logits divided by `logits_scaling`."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.models.decoder import CausalLM, DecoderLayer, DecoderModel, normed_input


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module):
        super().__init__(config, attention, mlp)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, hidden, residual, cos_sin, meta):
        hidden, residual = normed_input(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, meta) * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden) * self.residual_multiplier, residual


class GraniteForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        self.logits_scaling = config.logits_scaling

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Attention(config, *self.attention_biases(config), self.qk_norm, window,
                         scale=config.attention_multiplier)

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return GraniteDecoderLayer(config, attention, mlp)

    def make_model(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int) -> DecoderModel:
        return DecoderModel(config, layers, max_positions, embed_scale=config.embedding_multiplier)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.logits_scaling
