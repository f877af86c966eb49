"""The mixture-of-experts block whose router scores experts by sigmoid plus a learned correction bias
(DeepSeek-V3, Kimi K2, GLM-4.5, MiniMax-M2): the biased scores pick the experts, within the `topk_group` best of
`n_group` expert groups where the config groups them; the unbiased scores weigh them (renormalised, times
`routed_scaling_factor`); shared experts, where the config has them, run beside."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import all_reduce
from runtime.layers.mlp import MLP
from runtime.layers.moe import FusedExperts


def num_experts(config: PretrainedConfig) -> int:
    return getattr(config, "n_routed_experts", None) or getattr(config, "num_local_experts", None) or config.num_experts


class GroupedTopkRouter(nn.Module):
    """The router in float32: [T, top_k] expert weights and ids."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.groups, self.top_groups = getattr(config, "n_group", None) or 1, getattr(config, "topk_group", None) or 1
        self.renormalize = getattr(config, "norm_topk_prob", True)
        self.scaling = getattr(config, "routed_scaling_factor", None) or 1.0
        experts = num_experts(config)
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.empty(experts, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.linear(x.float(), self.weight).sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.groups > 1:
            tokens, experts = choice.shape
            group_scores = choice.view(tokens, self.groups, experts // self.groups).topk(2, dim=-1).values.sum(-1)
            kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(self.top_groups, dim=-1).indices, 1.0)
            choice = choice.masked_fill(~kept.bool().repeat_interleave(experts // self.groups, dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class SigmoidMoE(nn.Module):
    """The block, with `router` in place of the sigmoid one where a family's is another (DeepSeek-V2's and ERNIE
    4.5's softmax), and `num_shared` shared experts (biased where `shared_bias`) where a family's config does not
    name them `n_shared_experts`."""

    def __init__(self, config: PretrainedConfig, expert_size: int, router: nn.Module | None = None,
                 num_shared: int | None = None, shared_bias: bool = False):
        super().__init__()
        self.gate = router or GroupedTopkRouter(config)
        self.experts = FusedExperts(num_experts(config), config.hidden_size, expert_size)
        self.shared_experts = None
        num_shared = getattr(config, "n_shared_experts", None) if num_shared is None else num_shared
        if num_shared:
            self.shared_experts = MLP(config.hidden_size, expert_size * num_shared, shared_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.gate(x))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, reduce=False)
        return all_reduce(out)
