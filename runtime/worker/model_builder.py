"""A rank's model built from a checkpoint: the family's modules on the device, the checkpoint's weights loaded
(quantized where it is), packed for the device, and the LoRA slots attached when the engine serves adapters. The
model runner builds it at start, and again from new weights or on waking up."""

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from runtime.config import EngineConfig
from runtime.errors import InvalidInputError
from runtime.lora import LoRABatch, attach_lora
from runtime.models import load_weights, pack_linear_weights
from runtime.models.loader import tensor_names
from runtime.models.quantization import finish_quantized_linears, quantize_model
from runtime.models.spec import ModelSpec


def build_model(spec: ModelSpec, config: EngineConfig, device: torch.device, path: Path
                ) -> tuple[nn.Module, LoRABatch | None]:
    """The model with `path`'s weights (a checkpoint of `spec`'s architecture and shapes), and its LoRA batch map."""
    with spec.building(device):
        model = spec.model_class(spec.hf_config, spec.max_model_len)
        if spec.quantization is not None:
            quantize_model(model, spec.quantization, tensor_names(model, path))
    chunk = model.attention_chunk_size
    if chunk is not None and chunk % config.block_size:
        raise InvalidInputError("block_size", f"{config.block_size} does not divide the model's attention chunks "
                                f"({chunk} positions)")
    load_weights(model, path)
    finish_quantized_linears(model)
    pack_linear_weights(model)
    model.eval()
    lora_batch = None
    if config.enable_lora:
        lora_batch = attach_lora(model, config.max_loras, config.max_lora_rank, spec.dtype, device)
    return model, lora_batch


def check_same_shapes(current: Path, new: Path) -> None:
    """Refuse (`InvalidInputError`, param `model_path`) a checkpoint whose tensors are not the current one's, by name
    and shape, before the current weights are let go."""
    found, expected = _shapes(Path(new)), _shapes(Path(current))
    if not found:
        raise InvalidInputError("model_path", f"no *.safetensors checkpoint in {new}")
    if found != expected:
        differing = sorted(set(found.items()) ^ set(expected.items()))[:3]
        raise InvalidInputError("model_path", f"{new} is not a checkpoint of the served model's architecture and "
                                f"shapes (tensors that differ: {[name for name, _ in differing]})")


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes
