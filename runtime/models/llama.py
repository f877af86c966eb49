"""Llama: the plain decoder (`attention_bias` puts biases on q/k/v and o_proj alike)."""

from runtime.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    pass
