"""Mistral: Llama's architecture, every layer sliding over the last `sliding_window` positions when it is set."""

from runtime.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
