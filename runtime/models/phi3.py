"""Phi-3: Llama's decoder with q/k/v and gate/up fused in the checkpoint (`qkv_proj`, `gate_up_proj`), which the
fused layers' weight loaders split; longrope runs past its original context as transformers' Phi-3 generates
(`runtime.layers.rotary`)."""

from runtime.models.decoder import CausalLM


class Phi3ForCausalLM(CausalLM):
    pass
