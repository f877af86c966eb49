"""DeepSeek-V3 (and Kimi K2, which shares its architecture): multi-head latent attention (mla.py) and
DeepSeek's mixture of experts: sigmoid router scores plus a learned correction bias pick the experts, within the
`topk_group` best of `n_group` expert groups, and weigh them without the bias (renormalised, then times
`routed_scaling_factor`); shared experts beside them; the first `first_k_dense_replace` layers dense.
Multi-token-prediction layers in the checkpoint (past `num_hidden_layers`) are not loaded."""

import re

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import all_reduce
from runtime.errors import InvalidInputError
from runtime.models.decoder import MLP
from runtime.models.mla import LatentAttention, latent_cache_head_dim
from runtime.models.moe import FusedExperts, MoeCausalLM


class GroupedTopkRouter(nn.Module):
    """The router in float32, as the checkpoint keeps it: [T, top_k] expert weights and ids."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.top_k, self.groups, self.top_groups = config.num_experts_per_tok, config.n_group, config.topk_group
        self.renormalize, self.scaling = config.norm_topk_prob, config.routed_scaling_factor
        experts = config.n_routed_experts
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.empty(experts, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.linear(x.float(), self.weight).sigmoid()
        choice = scores + self.e_score_correction_bias
        tokens, experts = choice.shape
        by_group = choice.view(tokens, self.groups, experts // self.groups)
        group_scores = by_group.topk(2, dim=-1).values.sum(dim=-1)
        kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(self.top_groups, dim=-1).indices, 1.0)
        choice = choice.masked_fill(~kept.bool().repeat_interleave(experts // self.groups, dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class DeepseekMoE(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.gate = GroupedTopkRouter(config)
        self.experts = FusedExperts(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = None
        if config.n_shared_experts:
            self.shared_experts = MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.gate(x))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, reduce=False)
        return all_reduce(out)


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV3ForCausalLM(MoeCausalLM):
    # q_proj (no q_lora_rank) is a projection of its own: only gate and up are fused
    stacked_params = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config: PretrainedConfig, max_positions: int):
        self.num_layers = config.num_hidden_layers
        super().__init__(config, max_positions)

    @classmethod
    def cache_head_dim(cls, config: PretrainedConfig) -> int:
        return latent_cache_head_dim(config)

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if getattr(config, "quantization_config", None):
            raise InvalidInputError("model", "quantized DeepSeek-V3 checkpoints (block FP8) are not supported; use "
                                    "a bf16 or fp32 one")
        if config.n_routed_experts % (config.n_group or 1):
            raise InvalidInputError("model", f"{config.n_routed_experts} experts do not split into "
                                    f"{config.n_group} groups")

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> nn.Module:
        return LatentAttention(config)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if layer >= config.first_k_dense_replace:
            return DeepseekMoE(config)
        return MLP(config.hidden_size, config.intermediate_size)

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        layer = _LAYER.match(name)
        if layer and int(layer.group(1)) >= self.num_layers:  # a multi-token-prediction layer
            return None, ()
        return super().param_for(name)
