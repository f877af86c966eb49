"""The decoder-only transformer every family builds on: its layers (attention and MLP from runtime/layers/),
the model, the LM head, and the MoE variant that loads per-expert checkpoint tensors into stacked experts.

A family (`runtime/models/<family>.py`) subclasses `CausalLM` and sets what differs: biases on the q/k/v
projections, per-head q/k norms, each layer's attention and MLP, how checkpoint names map to parameters.
Module names mirror transformers' so checkpoint names map directly. Sliding-window layers pass their window
to the attention backend (`sliding_window.layer_windows`).
"""

import re
from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import pipeline_stage
from runtime.layers.attention import Attention, head_dim_of
from runtime.layers.linear import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from runtime.layers.mlp import MLP
from runtime.layers.norms import RMSNorm
from runtime.layers.rotary import RotaryTables, check_rope, rope_key
from runtime.layers.sliding_window import layer_windows

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, residual, cos_sin, meta):
        hidden, residual = normed_input(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


def normed_input(norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None):
    """A layer's input norm and the residual stream it adds to (the first layer starts the stream)."""
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)


class OtherStageLayer(nn.Module):
    """The place of a decoder layer that another pipeline stage holds: no parameters, never run."""


class DecoderModel(nn.Module):
    """Embedding (times `embed_scale`, when the family scales it), layers, final norm; one rotary table per
    set of RoPE parameters, each layer rotating by its own (`rotary.rope_key`). A pipeline stage holds its own
    layers (the others are `OtherStageLayer`s), the embedding on the first stage and the final norm on the last."""

    def __init__(self, config: PretrainedConfig, layers: list[DecoderLayer], max_positions: int,
                 norm: type[nn.Module] = RMSNorm, embed_scale: float | None = None):
        super().__init__()
        stage = pipeline_stage()
        self.stage_layers = stage.layers(len(layers))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size) if stage.first else None
        self.embed_scale = embed_scale
        self.layers = nn.ModuleList(layers)
        self.norm = norm(config.hidden_size, config.rms_norm_eps) if stage.last else None
        self.rope_keys = [rope_key(config, i) for i in range(len(layers))]
        self.rotary = nn.ModuleDict({key: RotaryTables(config, head_dim_of(config), max_positions, key)
                                     for key in dict.fromkeys(self.rope_keys[i] for i in self.stage_layers)})

    def forward(self, input_ids, positions, meta, carried: tuple[torch.Tensor, torch.Tensor] | None = None,
                images: tuple[list[int], torch.Tensor] | None = None):
        """The final hidden states; on a stage before the last, the (hidden, residual) it hands on, from the
        previous stage's `carried` ones when it is not the first. `images`: rows whose input is a picture's
        encoder output (placed after the token embedding and its scale), and those outputs; an output wider than
        the hidden states holds, after them, what the first layers' outputs gain at those rows (Qwen3-VL's deep
        stack: the next layer's norm adds the residual)."""
        tables = {key: rotary(positions) for key, rotary in self.rotary.items()}
        deep_stack = ()
        if carried is None:
            hidden, residual = self.embed_tokens(input_ids), None
            if self.embed_scale is not None:  # rounded to the weights' dtype first, as transformers does
                hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
            if images is not None:
                rows, embeds = torch.tensor(images[0], device=hidden.device), images[1].to(hidden.dtype)
                width = hidden.shape[-1]
                hidden[rows] = embeds[:, :width]
                deep_stack = embeds[:, width:].split(width, dim=-1) if embeds.shape[-1] > width else ()
        else:
            hidden, residual = carried
        for i in self.stage_layers:
            hidden, residual = self.layers[i](hidden, residual, tables[self.rope_keys[i]], meta)
            if i < len(deep_stack):
                hidden[rows] += deep_stack[i]
        if self.norm is None:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    """A decoder-only causal LM. Subclasses (one per family) override the class attributes and hooks."""

    qk_norm: type[nn.Module] | None = None  # the norm over each head of q and k (Qwen3: RMSNorm)
    # no LM head, so it only pools: a base model (`Qwen3Model`, as embedding checkpoints are saved) or a classifier
    headless = False
    # the checkpoint names its tensors without the `model.` prefix (a base model)
    bare_names = False
    # its pooled vector is its labels' logits (`runtime.models.classifier`)
    classifies = False
    supports_lora = True
    # layers that keep a state per sequence (`runtime.layers.state_cache`): no prefix caching, no speculation
    has_recurrent_state = False
    # layers that attend within chunks of this many positions (`runtime.layers.chunked_attention`), if any
    attention_chunk_size: int | None = None
    # a vision-language model: prompts may hold pictures, whose tokens' inputs its vision encoder computes
    # (`encode_images`; `runtime.multimodal`)
    takes_images = False
    # a picture's tokens attend to each other both ways (Gemma 3: `kernels.attention.pictures`)
    pictures_attend_both_ways = False
    # positions rotate by three axes (M-RoPE: `rope_layout` gives a request's, `runtime.multimodal.mrope`)
    multimodal_rope = False
    # checkpoint projection -> (our fused parameter, its shard)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__()
        windows = layer_windows(config, max_positions)
        stage = pipeline_stage()
        own = stage.layers(config.num_hidden_layers)
        layers = [self.make_layer(config, self.make_attention(config, windows[i], i), self.make_mlp(config, i))
                  if i in own else OtherStageLayer() for i in range(config.num_hidden_layers)]
        self.model = self.make_model(config, layers, max_positions)
        # the LM head runs on the first stage, beside the sampler, on the hidden states the last stage sends back
        self.lm_head = None if self.headless or not stage.first else ParallelLMHead(config.vocab_size,
                                                                                     config.hidden_size)
        self.tie_word_embeddings = not self.headless and bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings and self.lm_head is not None:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def cache_head_dim(cls, config: PretrainedConfig) -> int:
        """The head size of the KV cache and of the attention kernels."""
        return head_dim_of(config)

    @classmethod
    def text_config(cls, config: PretrainedConfig) -> PretrainedConfig:
        """The config the model is built from: the checkpoint's (see `language_model_config`)."""
        return config

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        """Refuse, at engine start, a config this implementation would run wrongly (raises InvalidInputError)."""
        check_rope(config)

    def attention_biases(self, config: PretrainedConfig) -> tuple[bool, bool]:
        """Whether the q/k/v projections and o_proj have biases (Llama's `attention_bias` sets both)."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    def make_attention(self, config: PretrainedConfig, window: int | None, layer: int) -> Attention:
        """Decoder layer `layer`'s attention, sliding over the last `window` positions unless None."""
        qkv_bias, o_bias = self.attention_biases(config)
        return Attention(config, qkv_bias, o_bias, self.qk_norm, window)

    def make_layer(self, config: PretrainedConfig, attention: Attention, mlp: nn.Module) -> nn.Module:
        return DecoderLayer(config, attention, mlp)

    def make_model(self, config: PretrainedConfig, layers: list[nn.Module], max_positions: int) -> DecoderModel:
        return DecoderModel(config, layers, max_positions)

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        """The feed-forward block of decoder layer `layer`."""
        return MLP(config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False)))

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        """The parameter a checkpoint tensor fills (named as a causal LM's checkpoint names it), and the shard
        arguments its weight loader takes after it; None for a tensor of a layer past the last decoder layer (a
        multi-token-prediction layer, which DeepSeek and GLM save there: `runtime.speculative.mtp` loads it)."""
        if self.past_last_layer(name):
            return None, ()
        for part, (fused, shard) in self.stacked_params.items():
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), (shard,)
        return name, ()

    def holds(self, param: str) -> bool:
        """Whether this pipeline stage holds parameter `param` (a tensor of another stage's part is skipped)."""
        layer = _LAYER.match(param)
        if layer is not None:
            return int(layer.group(1)) in self.model.stage_layers
        for prefix, module in (("model.embed_tokens.", self.model.embed_tokens), ("model.norm.", self.model.norm),
                               ("lm_head.", self.lm_head)):
            if param.startswith(prefix):
                return module is not None
        return True

    def past_last_layer(self, name: str) -> bool:
        """Whether a checkpoint tensor belongs to a layer past the last decoder layer."""
        layer = _LAYER.match(name)
        return layer is not None and int(layer.group(1)) >= len(self.model.layers)

    def forward(self, input_ids, positions, meta, carried=None, images=None):
        return self.model(input_ids, positions, meta, carried, images)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def pool_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """What a request pools, from the sum of its pooled final hidden states (float32): the sum itself, or
        a classifier's logits of it."""
        return pooled

    def checkpoint_tensors(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors as this model loads them (a classifier makes its head from the LM head's)."""
        return tensors


def language_model_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the language model in a checkpoint that holds more (a vision tower the engine leaves
    unloaded): its `text_config`, its embeddings tied as the checkpoint's own config says."""
    text = config.text_config
    text.tie_word_embeddings = getattr(config, "tie_word_embeddings", False)
    return text


# an expert's tensor: its weight, or a quantized checkpoint's codes, scales, zero points (`weight_packed`, ...;
# GPTQ's and AWQ's `qweight`, `scales`, `qzeros`, `g_idx`)
_EXPERT = re.compile(r"\.experts\.(\d+)\.(\w+)\.(weight(?:_\w+)?|qweight|scales|qzeros|g_idx)$")


class MoeCausalLM(CausalLM):
    """A causal LM with MoE blocks, loading per-expert checkpoint tensors into the stacked parameters."""

    supports_lora = False
    expert_names = ("gate_proj", "up_proj", "down_proj")  # the checkpoint's gate, up and down projections

    def param_for(self, name: str) -> tuple[str, tuple]:
        """A per-expert tensor fills its expert's rows of the stacked parameter (args: expert, gate or up), a
        quantized one's the parameter of its suffix (`gate_up_proj_weight_scale`: `QuantizedExperts`); fused
        expert tensors already carry the stacked parameter's name."""
        match = _EXPERT.search(name)
        if match is None or match.group(2) not in self.expert_names or self.past_last_layer(name):
            return super().param_for(name)
        expert, which = int(match.group(1)), self.expert_names.index(match.group(2))
        suffix = "" if match.group(3) == "weight" else f"_{match.group(3)}"
        stem = name[: match.start()] + ".experts."
        if which == 2:
            return stem + "down_proj" + suffix, (expert,)
        return stem + "gate_up_proj" + suffix, (expert, which)
