"""Qwen3-Next: a hybrid stack, three Gated DeltaNet (linear attention) layers to one of full attention
(`layer_types`). Its full attention gates each head's output and rotates a quarter of each head; every RMSNorm
scales by 1 + weight; the MLPs are Qwen2-MoE's sparse blocks with a gated shared expert.

Its linear layers keep a state per sequence (`runtime.layers.state_cache`), not keys and values per token, so a
cached prefix of blocks cannot restore them: the engine runs these models without prefix caching."""

from torch import nn
from transformers import PretrainedConfig

from runtime.layers.attention import Attention
from runtime.layers.gated_deltanet import GatedDeltaNet
from runtime.layers.norms import GemmaRMSNorm
from runtime.models.decoder import DecoderModel, MoeCausalLM, normed_input
from runtime.models.qwen2_moe import sparse_block_with_shared_expert


class HybridDecoderLayer(nn.Module):
    """A decoder layer whose token mixer is full attention (`self_attn`) or linear attention (`linear_attn`), as
    the checkpoint names them."""

    def __init__(self, config: PretrainedConfig, mixer: nn.Module, mlp: nn.Module):
        super().__init__()
        self.mixer_name = "linear_attn" if isinstance(mixer, GatedDeltaNet) else "self_attn"
        self.add_module(self.mixer_name, mixer)
        self.mlp = mlp
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, residual, cos_sin, meta):
        hidden, residual = normed_input(self.input_layernorm, hidden, residual)
        hidden = getattr(self, self.mixer_name)(hidden, cos_sin, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3NextForCausalLM(MoeCausalLM):
    qk_norm = GemmaRMSNorm
    has_recurrent_state = True
    grouped_projections = True  # the linear layers' projections as the checkpoint lays them out (gated_deltanet.py)

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> nn.Module:
        if config.layer_types[layer] == "linear_attention":
            return GatedDeltaNet(config, self.grouped_projections)
        return Attention(config, *self.attention_biases(config), self.qk_norm, window, gated=True)

    def make_layer(self, config: PretrainedConfig, attention: nn.Module, mlp: nn.Module) -> nn.Module:
        return HybridDecoderLayer(config, attention, mlp)

    def make_model(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int) -> DecoderModel:
        return DecoderModel(config, layers, max_positions, norm=GemmaRMSNorm)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return sparse_block_with_shared_expert(config, layer)

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        if name.startswith("mtp."):  # the multi-token-prediction layer: not loaded
            return None, ()
        return super().param_for(name)
