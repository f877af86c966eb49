"""Checkpoints in GPTQ's and AWQ's layouts (`quant_method: gptq | awq`), written by AutoRound, Intel's quantizer,
which exports both (plain round to nearest: no calibration set); and their oracle: every quantized
projection decoded by AutoRound's own code (its GPTQ torch kernel's module, its AWQ GEMM dequantizer), saved as
a float checkpoint that transformers loads.
"""

import json
import os
import shutil
from pathlib import Path

import torch
from auto_round import AutoRound
from auto_round.export.export_to_awq.utils import dequantize_gemm
from auto_round_extension.torch.qlinear_torch_zp import QuantLinear
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def write_auto_round(base: Path, out: Path, bits: int, group_size: int, sym: bool,
                     formats: tuple[str, ...] = ("auto_gptq", "auto_awq")) -> dict[str, Path]:
    """`base` quantized once by AutoRound and exported in each of `formats`: {quant_method: checkpoint}."""
    os.environ["AR_WORK_SPACE"] = str(out / "work")  # its offload folder, else in the working directory
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    quantizer = AutoRound(model, AutoTokenizer.from_pretrained(base), bits=bits, group_size=group_size, sym=sym,
                          iters=0, disable_opt_rtn=True, device_map="cpu")
    quantizer.quantize_and_save(str(out / "exported"), format=",".join(formats))
    shutil.rmtree(out / "work", ignore_errors=True)
    paths = {}
    for config in (out / "exported").rglob("config.json"):
        paths[json.loads(config.read_text())["quantization_config"]["quant_method"]] = config.parent
    return paths


def decoded_reference_model(path: Path, scratch: Path) -> torch.nn.Module:
    """transformers' model of `path` with every quantized projection's weight as AutoRound's code decodes it."""
    config = json.loads((path / "config.json").read_text())
    quantization = config.pop("quantization_config")
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    decoded = {}
    for name in [n for n in tensors if n.endswith(".qweight")]:
        module = name.removesuffix(".qweight")
        parts = {suffix: tensors.pop(f"{module}.{suffix}") for suffix in ("qweight", "qzeros", "scales", "g_idx")
                 if f"{module}.{suffix}" in tensors}
        decoded[f"{module}.weight"] = _decode(parts, quantization)
    scratch.mkdir(parents=True, exist_ok=True)
    for file in path.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json" and file.is_file():
            shutil.copy(file, scratch / file.name)
    (scratch / "config.json").write_text(json.dumps(config))
    save_file({**tensors, **decoded}, scratch / "model.safetensors")
    return AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32).eval()


def _decode(parts: dict[str, torch.Tensor], quantization: dict) -> torch.Tensor:
    """One projection's float32 weight [out, in], its scales widened first: code times scale in float32, as
    our engine computes it (AutoRound's modules would round each product to float16)."""
    bits, group, scales = quantization["bits"], quantization["group_size"], parts["scales"].float()
    if quantization["quant_method"] == "awq":
        return dequantize_gemm(parts["qweight"], parts["qzeros"], scales, bits, group).t().contiguous()
    inputs, outputs = parts["qweight"].shape[0] * 32 // bits, parts["qweight"].shape[1]
    layer = QuantLinear(bits, group, inputs, outputs, bias=False)  # its g_idx path slices rows by inputs: not used
    layer.qweight.copy_(parts["qweight"])
    layer.qzeros.copy_(parts["qzeros"])
    layer.scales = scales
    with torch.no_grad():  # the module's product with the identity: its weight, transposed
        return layer(torch.eye(inputs)).t().contiguous()
