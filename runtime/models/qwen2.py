"""Qwen2 (and Qwen2.5): biases on the q/k/v projections, none on o_proj."""

from transformers import PretrainedConfig

from runtime.models.decoder import CausalLM


class Qwen2ForCausalLM(CausalLM):
    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        return True, False
