"""DeepSeek-V2 / V2.5 / V2-Lite: DeepSeek-V3's latent attention (its rotary always over interleaved pairs) and
an older mixture of experts: softmax scores, the top k among all experts (`topk_method` greedy) or within the
`topk_group` groups of highest single score (group_limited_greedy), weighed as scored times
`routed_scaling_factor`, beside shared experts."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.layers.mla import LatentAttention
from runtime.models.deepseek_v3 import DeepseekV3ForCausalLM

_TOPK_METHODS = ("greedy", "group_limited_greedy")


class GroupLimitedRouter(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.top_k, self.scaling = config.num_experts_per_tok, config.routed_scaling_factor
        self.groups = (config.n_group or 1) if config.topk_method == "group_limited_greedy" else 1
        self.top_groups = config.topk_group or 1
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size, dtype=torch.float32),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.softmax(F.linear(x.float(), self.weight), dim=-1)
        if self.groups > 1:
            tokens, experts = scores.shape
            best = scores.view(tokens, self.groups, experts // self.groups).amax(dim=-1)
            kept = torch.zeros_like(best).scatter_(1, best.topk(self.top_groups, dim=-1).indices, 1.0)
            scores = scores.masked_fill(~kept.bool().repeat_interleave(experts // self.groups, dim=1), 0.0)
        weights, ids = scores.topk(self.top_k, dim=-1)
        return weights * self.scaling, ids


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if config.topk_method not in _TOPK_METHODS:
            raise InvalidInputError("model", f"topk_method {config.topk_method!r} is not supported; supported: "
                                    f"{', '.join(_TOPK_METHODS)}")

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> nn.Module:
        return LatentAttention(config, interleaved=True)

    def make_router(self, config: PretrainedConfig) -> nn.Module:
        return GroupLimitedRouter(config)
