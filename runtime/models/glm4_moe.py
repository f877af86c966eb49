"""GLM-4.5 / GLM-4.6: DeepSeek-V3's mixture of experts (sigmoid_moe.py: grouped sigmoid routing with a
correction bias, shared experts; dense first layers) under grouped-query attention with biased q/k/v, optional
per-head q/k norms and a rotary embedding over part of each head (`partial_rotary_factor`)."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.layers.mlp import MLP
from runtime.layers.norms import RMSNorm
from runtime.layers.sigmoid_moe import SigmoidMoE
from runtime.models.decoder import MoeCausalLM


class Glm4MoeForCausalLM(MoeCausalLM):
    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), False

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        qk_norm = RMSNorm if config.use_qk_norm else None
        return Attention(config, *self.attention_biases(config), qk_norm, window)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if layer >= config.first_k_dense_replace:
            return SigmoidMoE(config, config.moe_intermediate_size)
        return MLP(config.hidden_size, config.intermediate_size)
