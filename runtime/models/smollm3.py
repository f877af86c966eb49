"""SmolLM3: Llama's layers, but every `no_rope_layer_interval`-th one (those `no_rope_layers` marks 0) attends
without a rotary embedding (NoPE)."""

from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.models.decoder import CausalLM


class SmolLM3ForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Attention(config, *self.attention_biases(config), self.qk_norm, window,
                         rope=bool(config.no_rope_layers[layer]))
