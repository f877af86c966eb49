"""Seed-OSS: Llama's layers, biases on q/k/v where `attention_bias` and on o_proj where `attention_out_bias`."""

from transformers import PretrainedConfig

from runtime.models.decoder import CausalLM


class SeedOssForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), bool(config.attention_out_bias)
