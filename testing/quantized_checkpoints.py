"""Quantized copies of a test checkpoint, written by compressed-tensors (the library llm-compressor saves
through) as llm-compressor's data-free path does: the preset scheme applied to every projection but the LM
head, min-max scales and zero points (a static input scheme's, FP8's, from a calibration text), compressed and
saved with the scheme in `config.json`.

`reference_model` loads one back as the oracle: transformers' compressed-tensors integration (decompressing
the weights), with compressed-tensors' own input quantization on every projection the scheme quantizes (at the
checkpoint's `input_scale` where it is static).
`write_mxfp4_gpt_oss` and `mxfp4_reference_model` do the same for gpt-oss's MXFP4 experts;
`write_fine_grained_fp8` and `fine_grained_fp8_reference_model` for DeepSeek's FP8 layout, through
transformers' FineGrainedFP8 integration; `fp8_kv_reference_model` is the oracle of an FP8 KV cache.
"""

import json
import re
import shutil
from pathlib import Path
from unittest import mock

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
from compressed_tensors.entrypoints.convert import convert_checkpoint
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.quant_args import FP4_E2M1_DATA
from compressed_tensors.quantization.utils import calculate_qparams
from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales
from safetensors.torch import load_file, save_file
from transformers import (
    AttentionInterface,
    AutoModelForCausalLM,
    AutoTokenizer,
    CompressedTensorsConfig,
    FineGrainedFP8Config,
    Mxfp4Config,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

_EXPERT = re.compile(r"\.experts\.\d+\.\w+\.weight$")
# FP8: static per-tensor input scales, calibrated (`_calibrate_input_scales`)
SCHEMES = ("W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK")
QUANTIZES_ACTIVATIONS = {"W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK"}


def write_quantized(base: Path, out: Path, scheme: str) -> Path:
    """`base` quantized with compressed-tensors' preset `scheme`, saved to `out`."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
                                ignore=["lm_head"], quantization_status="initialized")
    _calibrate_input_scales(model, config, base)
    apply_quantization_config(model, config)
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is not None:
            _set_min_max_qparams(module, args)
        args = getattr(getattr(module, "quantization_scheme", None), "input_activations", None)
        if args is not None and not args.dynamic:
            low, high = module.calibrated
            module.input_scale.data = calculate_qparams(low, high, args)[0].reshape(module.input_scale.shape)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for file in out.glob("*.safetensors"):
        tensors = load_file(file)
        if any(_EXPERT.search(name) for name in tensors):
            save_file(_quantize_experts(tensors, config.config_groups["group_0"]), file, metadata={"format": "pt"})
    for file in base.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, out)
    return out


def _quantize_experts(tensors: dict[str, torch.Tensor], scheme: QuantizationScheme) -> dict[str, torch.Tensor]:
    """Each expert's matrix quantized as compressed-tensors quantizes a `Linear`: transformers 5 holds a layer's
    experts fused, in no `Linear` that compressed-tensors would target, and saves them per expert."""
    for name in [n for n in tensors if _EXPERT.search(n)]:
        weight = tensors.pop(name)
        holder = torch.nn.Sequential(torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False))
        holder[0].weight.data = weight.float()
        apply_quantization_config(holder, QuantizationConfig(config_groups={"group_0": scheme},
                                                             quantization_status="initialized"))
        _set_min_max_qparams(holder[0], scheme.weights)
        ModelCompressor.from_pretrained_model(holder).compress_model(holder)
        stem = name.removesuffix("weight")
        tensors.update({stem + key.removeprefix("0."): value for key, value in holder.state_dict().items()})
    return tensors


def dequantized_reference_model(path: Path, scratch: Path) -> torch.nn.Module:
    """transformers' model on `path` dequantized to float32 by compressed-tensors' own converter (into
    `scratch`): the oracle where transformers' integration cannot load a checkpoint (per-expert quantized
    tensors, which transformers 5 holds fused)."""
    convert_checkpoint(path, scratch, CompressedTensorsDequantizer(path, dtype=torch.float32))
    return AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32).eval()


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
        scales = {name.removesuffix(".input_scale"): tensor for file in path.glob("*.safetensors")
                  for name, tensor in load_file(file).items() if name.endswith(".input_scale")}
        for name, module in model.named_modules():  # static scales: the checkpoint's (dynamic ones have none)
            if name in scales:
                module.input_scale.data = scales[name].to(module.input_scale.dtype).reshape(module.input_scale.shape)
    return model.eval()


def _calibrate_input_scales(model: torch.nn.Module, config: QuantizationConfig, base: Path) -> None:
    """Where the scheme quantizes inputs with static scales: each projection's input minimum and maximum over a
    calibration text (llm-compressor's min-max observer over its calibration set), kept as `calibrated`."""
    args = config.config_groups["group_0"].input_activations
    if args is None or args.dynamic:
        return
    seen: dict[torch.nn.Module, list[torch.Tensor]] = {}

    def observe(module, inputs):
        x = inputs[0]
        low, high = x.amin().reshape(1), x.amax().reshape(1)
        seen[module] = [low, high] if module not in seen else [seen[module][0].minimum(low),
                                                                seen[module][1].maximum(high)]

    hooks = [m.register_forward_pre_hook(observe) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    tokenizer = AutoTokenizer.from_pretrained(base)
    with torch.no_grad():
        model(**tokenizer(" ".join(f"calibration text {i}, some words" for i in range(40)), return_tensors="pt"))
    for hook in hooks:
        hook.remove()
    for module, observed in seen.items():
        module.calibrated = observed


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


def write_mxfp4_gpt_oss(base: Path, out: Path) -> Path:
    """A gpt-oss checkpoint `base` with its experts in MXFP4, laid out as OpenAI publishes gpt-oss
    (`*_blocks` [E, out, in / 32, 16] two FP4 values a byte, `*_scales` [E, out, in / 32] E8M0), quantized by
    compressed-tensors' MX functions (scales from each block's largest magnitude, values rounded to FP4)."""
    tensors = load_file(next(base.glob("*.safetensors")))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        matrix = tensors.pop(name).float().transpose(1, 2)  # input-major [E, in, out] -> [E, out, in]
        blocks = matrix.reshape(*matrix.shape[:2], -1, 32)
        exponents = generate_mx_scales(blocks.abs().amax(dim=-1)).clamp(0, 254)
        values = FP4_E2M1_DATA.cast_to_fp4(blocks / torch.exp2(exponents - 127)[..., None])
        tensors[f"{name}_blocks"] = pack_fp4_to_uint8(values.reshape(-1, 32)).reshape(*blocks.shape[:3], 16)
        tensors[f"{name}_scales"] = exponents.to(torch.uint8)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for file in base.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def mxfp4_reference_model(path: Path) -> torch.nn.Module:
    """transformers' gpt-oss on `path`, its MXFP4 experts dequantized by its own integration."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                quantization_config=Mxfp4Config(dequantize=True)).eval()


def fp8_kv_reference_model(path: Path) -> torch.nn.Module:
    """transformers' model on `path`, its attention (SDPA, through transformers' attention interface) reading
    keys and values rounded to FP8 e4m3 with a scale of 1, as an FP8 KV cache holds them."""
    AttentionInterface.register("sdpa_fp8_kv", _sdpa_over_fp8_kv)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa_fp8_kv").eval()


def _sdpa_over_fp8_kv(module, query, key, value, *args, **kwargs):
    largest = torch.finfo(torch.float8_e4m3fn).max

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.clamp(-largest, largest).to(torch.float8_e4m3fn).to(t.dtype)

    return sdpa_attention_forward(module, query, rounded(key), rounded(value), *args, **kwargs)


def write_fine_grained_fp8(base: Path, out: Path) -> Path:
    """`base` quantized by transformers' FineGrainedFP8 integration and saved in DeepSeek's FP8 layout (e4m3
    weights, a `weight_scale_inv` per 128x128 block, `quant_method: fp8`). transformers quantizes on CPU as on a
    GPU; only its environment check asks for a GPU, so it is bypassed here."""
    with mock.patch.object(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *args, **kwargs: None):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32,
                                                     quantization_config=FineGrainedFP8Config())
    model.save_pretrained(out)
    for file in base.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, out)
    return out


def fine_grained_fp8_reference_model(path: Path) -> torch.nn.Module:
    """transformers' model on a `write_fine_grained_fp8` checkpoint, its weights dequantized by its integration."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
