"""DeepSeek-V3 (and Kimi K2, which shares its architecture): multi-head latent attention (mla.py) and
DeepSeek's mixture of experts (sigmoid_moe.py: grouped sigmoid routing with a correction bias, shared experts)
after `first_k_dense_replace` dense layers. The multi-token-prediction layer the checkpoint saves past
`num_hidden_layers` is loaded only as a speculative proposer (`runtime.speculative.mtp`)."""

from torch import nn
from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.layers.mla import LatentAttention, latent_cache_head_dim
from runtime.layers.mlp import MLP
from runtime.layers.sigmoid_moe import GroupedTopkRouter, SigmoidMoE
from runtime.models.decoder import MoeCausalLM


class DeepseekV3ForCausalLM(MoeCausalLM):
    # q_proj (no q_lora_rank) is a projection of its own: only gate and up are fused
    stacked_params = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    @classmethod
    def cache_head_dim(cls, config: PretrainedConfig) -> int:
        return latent_cache_head_dim(config)

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if config.n_routed_experts % (config.n_group or 1):
            raise InvalidInputError("model", f"{config.n_routed_experts} experts do not split into "
                                    f"{config.n_group} groups")

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> nn.Module:
        return LatentAttention(config)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if layer >= config.first_k_dense_replace:
            return SigmoidMoE(config, config.moe_intermediate_size, self.make_router(config))
        return MLP(config.hidden_size, config.intermediate_size)

    def make_router(self, config: PretrainedConfig) -> nn.Module:
        return GroupedTopkRouter(config)
