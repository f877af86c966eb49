"""Mistral: Llama's architecture plus a sliding window, refused (by `CausalLM.check_config`) wherever it would
be shorter than max_model_len, until sliding-window attention exists."""

from runtime.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
