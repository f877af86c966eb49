"""gpt-oss: biased q/k/v/o projections, learned per-head attention sinks, sliding layers alternating with full
ones (`layer_types`), YaRN RoPE, and an MoE block on every layer: a biased router whose top-k weights are
renormalised, experts with biases and a clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`).

Checkpoints in bf16/fp32 (transformers' layout: each layer's experts fused, input-major, gate and up
interleaved), or with MXFP4 experts as OpenAI publishes them (`quantization_config`'s `quant_method: mxfp4`),
which stay MXFP4 in memory (`runtime.layers.quantization.mxfp4`).
"""

from functools import partial

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import clamped_swiglu
from runtime.layers.attention import Attention
from runtime.layers.moe import FusedExperts, SparseMoeBlock
from runtime.layers.quantization.checkpoint import is_mxfp4
from runtime.layers.quantization.mxfp4 import Mxfp4Experts, gate_then_up
from runtime.models.decoder import MoeCausalLM


def _activation(config: PretrainedConfig):
    return partial(clamped_swiglu, alpha=config.swiglu_alpha, limit=config.swiglu_limit)


class GptOssExperts(FusedExperts):
    def __init__(self, config: PretrainedConfig):
        super().__init__(config.num_local_experts, config.hidden_size, config.intermediate_size, bias=True,
                         activation=_activation(config))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, *shard) -> None:
        """The checkpoint's fused tensors ([E, H, 2 I] and [E, I, H] input-major, gate and up interleaved) in the
        layout `FusedExperts` loads (which comes back here with one expert's slice: `shard` holds its index)."""
        if shard:
            pass
        elif param is self.gate_up_proj:
            loaded = gate_then_up(loaded, -1).transpose(1, 2)
        elif param is self.gate_up_proj_bias:
            loaded = gate_then_up(loaded, -1)
        elif param is self.down_proj:
            loaded = loaded.transpose(1, 2)
        super().weight_loader(param, loaded, *shard)


class GptOssForCausalLM(MoeCausalLM):
    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        return Attention(config, *self.attention_biases(config), self.qk_norm, window, sinks=True)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if is_mxfp4(config):
            experts = Mxfp4Experts(config.num_local_experts, config.hidden_size, config.intermediate_size,
                                   _activation(config))
        else:
            experts = GptOssExperts(config)
        return SparseMoeBlock(config.hidden_size, config.num_local_experts, config.num_experts_per_tok,
                              config.intermediate_size, renormalize=True, experts=experts, router_bias=True)

    def param_for(self, name: str) -> tuple[str, tuple]:
        return super().param_for(name.replace(".mlp.router.", ".mlp.gate."))
