"""ERNIE 4.5 (dense and MoE): biases on every projection where `use_bias` (the dense model), a rotary embedding
over interleaved pairs, and MoE
layers (every `moe_layer_interval`-th from `moe_layer_start_index` to `moe_layer_end_index`) routed by softmax
scores, picked with a correction bias added, weighed without it and renormalised (the sum clamped below at
`moe_norm_min`), beside shared experts."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.layers.attention import Attention
from runtime.layers.mlp import MLP
from runtime.layers.sigmoid_moe import SigmoidMoE
from runtime.models.decoder import CausalLM, MoeCausalLM


class ErnieRouter(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.top_k, self.norm_min = config.num_experts_per_tok, config.moe_norm_min
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=torch.float32),
                                   requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.empty(1, config.num_experts, dtype=torch.float32),
                                                    requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.softmax(F.linear(x.float(), self.weight), dim=-1)
        ids = (scores + self.e_score_correction_bias).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        return weights / weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min), ids


class Ernie4_5ForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.use_bias), bool(config.use_bias)

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Attention(config, *self.attention_biases(config), self.qk_norm, window, interleaved=True)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size, bool(config.use_bias))


class Ernie4_5_MoeForCausalLM(MoeCausalLM, Ernie4_5ForCausalLM):
    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if config.use_bias:  # transformers gives the MoE model's LM head a bias then; no released checkpoint has one
            raise InvalidInputError("model", "use_bias (biased projections and LM head) is not supported for "
                                    "ERNIE 4.5 MoE")
    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if ((layer + 1) % config.moe_layer_interval == 0
                and config.moe_layer_start_index <= layer <= config.moe_layer_end_index):
            return SigmoidMoE(config, config.moe_intermediate_size, ErnieRouter(config),
                              config.moe_num_shared_experts, bool(config.use_bias))
        return super().make_mlp(config, layer)

    def param_for(self, name: str) -> tuple[str, tuple]:
        return super().param_for(name.replace(".mlp.moe_statics.", ".mlp.gate."))
