"""MiniMax-M2: q/k norms across every head (cross_head_norm.py), a rotary embedding over part of each head
(`rotary_dim`), and on every layer a mixture of experts routed by sigmoid scores plus a correction bias
(sigmoid_moe.py, no expert groups, weights renormalised). Its checkpoints name the block `block_sparse_moe`, the
experts' projections w1 (gate), w3 (up), w2 (down), and keep the bias beside the router."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.layers.cross_head_norm import CrossHeadNormAttention
from runtime.layers.sigmoid_moe import SigmoidMoE
from runtime.models.decoder import MoeCausalLM


class MiniMaxM2ForCausalLM(MoeCausalLM):
    expert_names = ("w1", "w3", "w2")

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return CrossHeadNormAttention(config, *self.attention_biases(config), window)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return SigmoidMoE(config, config.intermediate_size)

    def param_for(self, name: str) -> tuple[str, tuple]:
        name = name.replace(".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")
        return super().param_for(name.replace(".block_sparse_moe.", ".mlp."))
