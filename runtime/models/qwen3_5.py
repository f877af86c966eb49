"""Qwen3.5: Qwen3-Next's hybrid stack (Gated DeltaNet layers, then one of gated full attention) with the linear
layers' projections saved one tensor each (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), dense MLPs
(Qwen3.5) or sparse blocks on every layer with a gated shared expert (Qwen3.5-MoE). Its rotary embedding is
multimodal (sections of each head rotate by time, height and width); for text the three positions are the token's
own, which is the plain rotary embedding over a quarter of each head.

The checkpoints as published hold a vision tower beside the language model (`...ForConditionalGeneration`, its
config's `text_config`): they are served as text models, the vision tower and the multi-token-prediction layer
left unloaded."""

from torch import nn
from transformers import PretrainedConfig

from runtime.models.decoder import MLP, CausalLM, language_model_config
from runtime.models.moe import SparseMoeBlock
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


def _text_only(family: type[Qwen3_5ForCausalLM]) -> type[Qwen3_5ForCausalLM]:
    """The published checkpoint's architecture (`Qwen3_5ForConditionalGeneration`), served as its text model."""

    class TextOnly(family):
        @classmethod
        def text_config(cls, config: PretrainedConfig) -> PretrainedConfig:
            return language_model_config(config)

        def param_for(self, name: str) -> tuple[str | None, tuple]:
            if name.startswith("model.visual."):
                return None, ()
            return super().param_for(name.replace("model.language_model.", "model.", 1))

    TextOnly.__name__ = TextOnly.__qualname__ = family.__name__.replace("ForCausalLM", "ForConditionalGeneration")
    return TextOnly


Qwen3_5ForConditionalGeneration = _text_only(Qwen3_5ForCausalLM)
Qwen3_5MoeForConditionalGeneration = _text_only(Qwen3_5MoeForCausalLM)
