"""Qwen3.5: Qwen3-Next's hybrid stack (Gated DeltaNet layers, then one of gated full attention) with the linear
layers' projections saved one tensor each (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), dense MLPs
(Qwen3.5) or sparse blocks on every layer with a gated shared expert (Qwen3.5-MoE). Its rotary embedding is
multimodal (interleaved frequencies of each head's rotated quarter turn by time, row and column): for text the
three positions are the token's own, which is the plain rotary embedding.

The checkpoints as published (`...ForConditionalGeneration`, its config's `text_config`) hold a vision tower beside
the language model (`qwen3_5_vision`): pictures in prompts take M-RoPE's three positions
(`runtime.multimodal.mrope`). The multi-token-prediction layer is left unloaded."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import MLP
from runtime.layers.moe import SparseMoeBlock
from runtime.models.decoder import CausalLM
from runtime.models.qwen2_5_vl import QwenVisionLanguage
from runtime.models.qwen3_5_vision import Qwen3_5VisionTower
from runtime.models.qwen3_next import Qwen3NextForCausalLM


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    grouped_projections = False
    stacked_params = {
        **CausalLM.stacked_params,
        "in_proj_qkv": ("in_proj_qkvz", (0, 1, 2)),
        "in_proj_z": ("in_proj_qkvz", 3),
        "in_proj_b": ("in_proj_ba", 0),
        "in_proj_a": ("in_proj_ba", 1),
    }

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                              config.moe_intermediate_size, True, config.shared_expert_intermediate_size)


class Qwen3_5Vision(QwenVisionLanguage):
    """Qwen3.5 as published: its vision tower beside the language model, which rotates by interleaved M-RoPE."""

    tower = Qwen3_5VisionTower
    interleaved_rope = True
    mrope_section = [11, 11, 10]


class Qwen3_5ForConditionalGeneration(Qwen3_5Vision, Qwen3_5ForCausalLM):
    pass


class Qwen3_5MoeForConditionalGeneration(Qwen3_5Vision, Qwen3_5MoeForCausalLM):
    pass
