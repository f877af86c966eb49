"""Gemma 3 (text, `gemma3_text`): Gemma 2's layers plus per-head q/k norms (1 + weight), no attention soft cap
(transformers' Gemma 3 applies none, whatever the config says), and its own RoPE base for the local (sliding)
layers (`rope_local_base_freq`, kept per layer type in `rope_parameters`). With its vision tower: `gemma3_vl`."""

from transformers import PretrainedConfig

from runtime.layers.norms import GemmaRMSNorm
from runtime.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = GemmaRMSNorm

    def attention_softcap(self, config: PretrainedConfig) -> float | None:
        return None
