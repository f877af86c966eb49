"""The model that the engine options name, resolved when the engine is built: its directory (downloaded
from the Hub if need be), its transformers config, the dtype it runs in and its context length.

Options that can only be checked against the model (max_model_len, tensor and pipeline parallel sizes) are
checked here, with errors naming the option.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from runtime.config import DTYPES, EngineConfig
from runtime.errors import InvalidInputError, require
from runtime.layers.quantization import Quantization
from runtime.layers.rotary import max_context
from runtime.models import CausalLM, model_class
from runtime.models.classifier import resolve_classifier_tokens
from runtime.models.files import resolve_model_path
from runtime.models.weights_identity import checkpoint_fingerprint


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    hf_config: PretrainedConfig
    dtype: torch.dtype
    max_model_len: int
    tokenizer: str  # the tokenizer's directory or Hub id
    model_class: type[CausalLM]  # the family's implementation (runtime.models.registry)
    quantization: Quantization | None = None  # a quantized checkpoint's scheme (runtime.layers.quantization)
    serving: str = ""  # how its weights are served: dtype, KV cache dtype, quantization, tensor-parallel size
    weights_version: str = ""  # the checkpoint's fingerprint as served (runtime.models.weights_identity)

    @classmethod
    def resolve(cls, config: EngineConfig) -> "ModelSpec":
        path = resolve_model_path(config.model)
        checkpoint_config = AutoConfig.from_pretrained(path)
        for field, value in (config.hf_overrides or {}).items():
            setattr(checkpoint_config, field, value)
        family = model_class(checkpoint_config)
        hf_config = family.text_config(checkpoint_config)
        tokenizer = config.tokenizer or str(path)
        if family.classifies:
            resolve_classifier_tokens(hf_config, AutoTokenizer.from_pretrained(tokenizer).convert_tokens_to_ids)
        limit = max_context(hf_config)
        max_model_len = hf_config.max_position_embeddings if config.max_model_len is None else config.max_model_len
        require(max_model_len <= limit, "max_model_len",
                f"{max_model_len} exceeds the model's context ({limit}: max_position_embeddings"
                f"{'' if limit == hf_config.max_position_embeddings else ' times its dynamic NTK factor'})")
        _check_tp_split(hf_config, config.tensor_parallel_size)
        _check_pp_split(hf_config, config)
        family.check_config(hf_config, max_model_len)
        require(config.runner == "pooling" or not family.headless, "runner",
                f"{family.__name__} has no LM head: it serves {'scores' if family.classifies else 'embeddings'} "
                "only (runner: pooling)")
        text_only = family.takes_images and config.limit_mm_per_prompt["image"] == 0
        if text_only:  # no tower built or loaded
            hf_config.vision_language = None
        elif family.pictures_attend_both_ways:  # a prefill chunk holds a picture whole
            tokens = family.picture_tokens(checkpoint_config)
            require(tokens <= config.max_num_batched_tokens, "max_num_batched_tokens",
                    f"must hold a picture's {tokens} tokens: {family.__name__}'s attend to each other both ways")
        require(not config.enable_lora or family.supports_lora or text_only, "enable_lora",
                f"LoRA is not supported for {family.__name__} models"
                f"{' serving images (limit_mm_per_prompt image 0 serves it text-only)' if family.takes_images else ''}")
        require(config.speculative_config is None or not family.has_recurrent_state, "speculative_config",
                f"speculative decoding is not supported for {family.__name__}: its linear-attention layers' state "
                "cannot take back rejected draft tokens")
        require(config.pipeline_parallel_size == 1 or not family.takes_images or text_only, "pipeline_parallel_size",
                f"{family.__name__} serving images runs as one pipeline stage (tensor parallel shards it; "
                "limit_mm_per_prompt image 0 serves it text-only)")
        quantization = Quantization.from_config(checkpoint_config, config.quantization)
        dtype = _dtype(config, hf_config)
        serving = f"{dtype}|{config.kv_cache_dtype}|{config.quantization}|tp{config.tensor_parallel_size}"
        if config.hf_overrides:
            serving += f"|{json.dumps(config.hf_overrides, sort_keys=True)}"
        return cls(path, hf_config, dtype, max_model_len, tokenizer, family, quantization, serving,
                   checkpoint_fingerprint(path, serving))

    @contextmanager
    def building(self, device: torch.device) -> Iterator[None]:
        """Modules created inside take the model's dtype and live on `device`, as its implementation is built."""
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(device):
                yield
        finally:
            torch.set_default_dtype(default_dtype)

    @property
    def head_dim(self) -> int:
        """The KV cache's head size (a latent-attention model's latent plus rotary part)."""
        return self.model_class.cache_head_dim(self.hf_config)

    @property
    def takes_images(self) -> bool:
        """A vision-language model serving pictures (not text-only)."""
        return self.model_class.takes_images and self.hf_config.vision_language is not None

    @property
    def pictures_attend_both_ways(self) -> bool:
        return self.takes_images and self.model_class.pictures_attend_both_ways

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def pooled_size(self) -> int:
        """The length of what a pooling request returns: a classifier's labels, else the hidden size."""
        return self.hf_config.hidden_size if self.labels is None else len(self.labels)

    @property
    def labels(self) -> list[str] | None:
        """A classifier's label names in its logits' order (`id2label`); None for a model that does not classify."""
        if not self.model_class.classifies:
            return None
        names = self.hf_config.id2label or {}
        return [str(names.get(i, f"LABEL_{i}")) for i in range(self.hf_config.num_labels)]


def _dtype(config: EngineConfig, hf_config: PretrainedConfig) -> torch.dtype:
    """The named dtype; for `auto`, float32 on CPU, else the checkpoint's 16-bit dtype, else bfloat16."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if config.device == "cpu":
        return torch.float32
    saved = getattr(hf_config, "dtype", None)
    saved = DTYPES.get(saved, saved) if isinstance(saved, str) else saved
    return saved if saved in (torch.bfloat16, torch.float16) else torch.bfloat16


def _check_tp_split(hf: PretrainedConfig, tp: int) -> None:
    """Refuse a tensor-parallel size the model's shapes cannot be split by."""
    kv = hf.num_key_value_heads
    problems = []
    if hf.num_attention_heads % tp:
        problems.append(f"{hf.num_attention_heads} attention heads")
    if kv % tp and tp % kv:
        problems.append(f"{kv} KV heads (neither divides the other)")
    for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "linear_num_key_heads"):
        size = getattr(hf, name, None)
        if size and size % tp:
            problems.append(f"{name.replace('_', ' ')} {size}")
    if problems:
        raise InvalidInputError("tensor_parallel_size",
                                f"{tp} cannot split this model: {', '.join(problems)} are not divisible by {tp}")


def _check_pp_split(hf: PretrainedConfig, config: EngineConfig) -> None:
    """Refuse more stages than layers, or a layer partition that does not add up to the model's layers."""
    pp, layers, partition = config.pipeline_parallel_size, hf.num_hidden_layers, config.pp_layer_partition
    require(pp <= layers, "pipeline_parallel_size", f"{pp} stages for {layers} decoder layers")
    require(partition is None or sum(partition) == layers, "pp_layer_partition",
            f"{list(partition or ())} adds up to {sum(partition or ())} layers; the model has {layers}")
