"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with Qwen2-MoE's layer plan, and no shared expert."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import MLP
from runtime.layers.moe import SparseMoeBlock
from runtime.layers.norms import RMSNorm
from runtime.models.decoder import MoeCausalLM
from runtime.models.qwen2_moe import is_sparse


class Qwen3MoeForCausalLM(MoeCausalLM):
    qk_norm = RMSNorm

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if not is_sparse(config, layer):
            return MLP(config.hidden_size, config.intermediate_size)
        return SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                              config.moe_intermediate_size, config.norm_topk_prob)
