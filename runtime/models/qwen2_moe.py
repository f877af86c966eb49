"""Qwen2-MoE: Qwen2's attention (`qkv_bias`), sparse MoE blocks with a gated shared expert; top-k weights
renormalised only if `norm_topk_prob`; layers in `mlp_only_layers` or off `decoder_sparse_step` stay dense."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import MLP
from runtime.layers.moe import SparseMoeBlock
from runtime.models.decoder import MoeCausalLM


def is_sparse(config: PretrainedConfig, layer: int) -> bool:
    """Whether Qwen-MoE's decoder layer `layer` has an MoE block (else a dense MLP)."""
    return (layer not in config.mlp_only_layers and config.num_experts > 0
            and (layer + 1) % config.decoder_sparse_step == 0)


def sparse_block_with_shared_expert(config: PretrainedConfig, layer: int) -> nn.Module:
    """Layer `layer`'s feed-forward block: a sparse block with a gated shared expert, or a dense MLP (Qwen2-MoE,
    Qwen3-Next)."""
    if not is_sparse(config, layer):
        return MLP(config.hidden_size, config.intermediate_size)
    return SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                          config.moe_intermediate_size, config.norm_topk_prob, config.shared_expert_intermediate_size)


class Qwen2MoeForCausalLM(MoeCausalLM):
    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(getattr(config, "qkv_bias", True)), False

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return sparse_block_with_shared_expert(config, layer)
