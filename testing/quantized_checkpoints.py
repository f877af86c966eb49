"""Quantized copies of a test checkpoint, written by compressed-tensors (the library llm-compressor saves
through) as llm-compressor's data-free path does: the preset scheme applied to every projection but the LM
head, min-max scales and zero points, compressed and saved with the scheme in `config.json`.

`reference_model` loads one back as the oracle: transformers' compressed-tensors integration (decompressing
the weights), with compressed-tensors' own input quantization on every projection the scheme quantizes.
"""

import json
import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

SCHEMES = ("W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK")
QUANTIZES_ACTIVATIONS = {"W8A8", "FP8_DYNAMIC", "FP8_BLOCK"}


def write_quantized(base: Path, out: Path, scheme: str) -> Path:
    """`base` quantized with compressed-tensors' preset `scheme`, saved to `out`."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
                                ignore=["lm_head"], quantization_status="initialized")
    apply_quantization_config(model, config)
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is not None:
            _set_min_max_qparams(module, args)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for file in base.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, out)
    return out


def reference_model(path: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 quantization_config=CompressedTensorsConfig(dequantize=True))
    raw = json.loads((path / "config.json").read_text())["quantization_config"]
    inputs = {name: QuantizationScheme(targets=group["targets"],
                                       input_activations=QuantizationArgs(**group["input_activations"]))
              for name, group in raw["config_groups"].items() if group.get("input_activations")}
    if inputs:
        apply_quantization_config(model, QuantizationConfig(config_groups=inputs, ignore=raw["ignore"],
                                                            quantization_status="frozen"))
    return model.eval()


def _set_min_max_qparams(module: torch.nn.Module, args: QuantizationArgs) -> None:
    """A weight's scale and zero point from its minimum and maximum over each of the scheme's groups (what
    llm-compressor's min-max observer computes)."""
    w = module.weight.data
    strategy = getattr(args.strategy, "value", args.strategy)
    if strategy == "group":
        grouped = w.reshape(w.shape[0], -1, args.group_size)
        low, high = grouped.amin(-1), grouped.amax(-1)
    elif strategy == "channel":
        low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    elif strategy == "tensor":
        low, high = w.amin().reshape(1), w.amax().reshape(1)
    else:  # block
        rows, columns = args.block_structure
        blocks = w.reshape(-(-w.shape[0] // rows), rows, -(-w.shape[1] // columns), columns)
        low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
    scale, zero = calculate_qparams(low, high, args)
    module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(module.weight_zero_point.shape)
