"""Gemma 2: embeddings scaled by sqrt(hidden_size), RMSNorms that scale by 1 + weight, a norm after attention
and on both sides of the MLP, a tanh-GELU gated MLP, attention scaled by query_pre_attn_scalar ** -0.5 with
soft-capped scores, sliding layers alternating with full ones (`layer_types`), soft-capped final logits and
(usually) tied embeddings. Bidirectional attention (embedding variants) is refused."""

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import gelu_tanh_and_mul
from runtime.errors import InvalidInputError
from runtime.layers.attention import Attention
from runtime.layers.mlp import MLP
from runtime.layers.norms import GemmaRMSNorm
from runtime.models.decoder import CausalLM, DecoderModel, normed_input


class GemmaDecoderLayer(nn.Module):
    """Norms around both blocks: each block's output is normalised before the residual add."""

    def __init__(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, hidden, residual, cos_sin, meta):
        hidden, residual = normed_input(self.input_layernorm, hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(hidden, cos_sin, meta))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2ForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if getattr(config, "use_bidirectional_attention", False):
            raise InvalidInputError("model", "bidirectional attention (use_bidirectional_attention) is not supported")
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise InvalidInputError("model", f"hidden_activation {config.hidden_activation!r} is not supported; "
                                    "supported: gelu_pytorch_tanh")

    def attention_softcap(self, config: PretrainedConfig) -> float | None:
        return config.attn_logit_softcapping

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Attention(config, *self.attention_biases(config), self.qk_norm, window,
                         scale=config.query_pre_attn_scalar**-0.5, softcap=self.attention_softcap(config))

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return GemmaDecoderLayer(config, attention, mlp)

    def make_model(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int) -> DecoderModel:
        return DecoderModel(config, layers, max_positions, norm=GemmaRMSNorm, embed_scale=config.hidden_size**0.5)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size, activation=gelu_tanh_and_mul)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        if self.final_softcap:
            logits = self.final_softcap * torch.tanh(logits / self.final_softcap)
        return logits
