"""A rank's model built from a checkpoint: the family's modules on the device, the checkpoint's weights loaded
(quantized where it is), packed for the device, and the LoRA slots attached when the engine serves adapters. The
model runner builds it at start, and again from new weights or on waking up."""

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from runtime.config import EngineConfig
from runtime.errors import InvalidInputError
from runtime.layers.quantization import finish_quantized_linears, quantize_model
from runtime.lora import LoRABatch, attach_lora
from runtime.models import load_weights, pack_linear_weights
from runtime.models.loader import load_tensors, tensor_names
from runtime.models.spec import ModelSpec


def build_model(spec: ModelSpec, config: EngineConfig, device: torch.device, path: Path,
                tensors: list[tuple[str, torch.Tensor]] | None = None, encoder_only: bool = False
                ) -> tuple[nn.Module, LoRABatch | None]:
    """The model with `path`'s weights (a checkpoint of `spec`'s architecture and shapes), or with `tensors`
    (every checkpoint tensor, by name: a trainer's), and its LoRA batch map. `encoder_only`: a vision-language
    model's vision tower and projector alone, the language model neither built nor read."""
    model_class = spec.model_class
    with spec.building(device):
        if encoder_only:
            model = model_class(model_class.encoder_only(spec.hf_config), spec.max_model_len)
            model.model = model.lm_head = None
        else:
            model = model_class(spec.hf_config, spec.max_model_len)
        if spec.quantization is not None:
            quantize_model(model, spec.quantization, tensor_names(model, path))
    chunk = model.attention_chunk_size
    if chunk is not None and chunk % config.block_size:
        raise InvalidInputError("block_size", f"{config.block_size} does not divide the model's attention chunks "
                                f"({chunk} positions)")
    if tensors is None:
        load_weights(model, path, model.encoder_tensor if encoder_only else None)
    else:
        load_tensors(model, tensors)
    finish_quantized_linears(model)
    pack_linear_weights(model)
    model.eval()
    lora_batch = None
    if config.enable_lora:
        lora_batch = attach_lora(model, config.max_loras, config.max_lora_rank, spec.dtype, device)
    return model, lora_batch


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the safetensors shards of `path`, by name."""
    shapes = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], source: str,
                 param: str) -> None:
    """Refuse (`InvalidInputError` naming `param`) new weights from `source` whose tensors are not the served
    checkpoint's, by name and shape, before the current weights are let go."""
    if not found:
        raise InvalidInputError(param, f"no *.safetensors checkpoint in {source}")
    if found != expected:
        differing = sorted(set(found.items()) ^ set(expected.items()))[:3]
        raise InvalidInputError(param, f"{source} is not a checkpoint of the served model's architecture and shapes "
                                f"(tensors that differ: {[name for name, _ in differing]})")
