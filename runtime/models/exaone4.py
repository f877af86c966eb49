"""EXAONE 4.0: OLMo 2's post-norm layers with per-head q/k norms; where the config slides (three layers of
four by `layer_types`), the sliding layers rotate and the full ones attend without a rotary embedding."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.layers.norms import RMSNorm
from runtime.models.decoder import CausalLM
from runtime.models.olmo2 import Olmo2DecoderLayer


class Exaone4ForCausalLM(CausalLM):
    supports_lora = False  # not checked against PEFT for this family
    qk_norm = RMSNorm

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        rope = not config.sliding_window or config.layer_types[layer] == "sliding_attention"
        return Attention(config, *self.attention_biases(config), self.qk_norm, window, rope=rope)

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return Olmo2DecoderLayer(config, attention, mlp)
