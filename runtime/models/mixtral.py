"""Mixtral: Mistral's attention, every layer an MoE block whose top-k weights are always renormalised.

Its checkpoints name the block `block_sparse_moe` and the experts' projections w1 (gate), w3 (up), w2 (down).
"""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.moe import SparseMoeBlock
from runtime.models.decoder import MoeCausalLM


class MixtralForCausalLM(MoeCausalLM):
    expert_names = ("w1", "w3", "w2")

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, config.num_local_experts, config.num_experts_per_tok,
                              config.intermediate_size, renormalize=True)

    def param_for(self, name: str) -> tuple[str, tuple]:
        return super().param_for(name.replace(".block_sparse_moe.", ".mlp."))
