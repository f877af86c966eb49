"""A LoRA adapter in PEFT's format, read and checked against the base model before it is queued.

`<path>/adapter_config.json` gives the rank `r`, `lora_alpha` and `use_rslora`;
`<path>/adapter_model.safetensors` holds, per decoder layer and projection,
`lora_A.weight` [r, in] and `lora_B.weight` [out, r]. The scaling (alpha / r,
or alpha / sqrt(r) with rsLoRA) is folded into B once, here.
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from runtime.errors import InvalidInputError

# PEFT's target module names, as our decoder's projections know them
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class LoRARequest:
    """Which adapter a request runs with: its name (what clients call it) and a local directory."""

    name: str
    path: str


@dataclass
class LoRAAdapter:
    name: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> (A, B x scaling)


def model_shapes(hf_config) -> dict[str, tuple[int, int]]:
    """Each target module's full (in, out) features in this model."""
    hidden, heads, kv_heads = hf_config.hidden_size, hf_config.num_attention_heads, hf_config.num_key_value_heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    inter = hf_config.intermediate_size
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def load_adapter(request: LoRARequest, hf_config, max_rank: int) -> LoRAAdapter:
    """Read and check an adapter; anything this model cannot run is an InvalidInputError naming `model`."""
    path = Path(request.path)

    def refuse(why: str) -> InvalidInputError:
        return InvalidInputError("model", f"LoRA adapter {request.name!r}: {why}")

    for name in ("adapter_config.json", "adapter_model.safetensors"):
        if not (path / name).is_file():
            raise refuse(f"missing {name}")
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        tensors = load_file(str(path / "adapter_model.safetensors"))
    except (ValueError, OSError) as e:
        raise refuse(f"unreadable: {e}") from None
    if not isinstance(config, dict):
        raise refuse("adapter_config.json is not a JSON object")
    rank = config.get("r")
    if not isinstance(rank, int) or not 1 <= rank <= max_rank:
        raise refuse(f"rank r={rank!r} must be an integer in [1, max_lora_rank={max_rank}]")
    if config.get("use_dora") or config.get("modules_to_save"):
        raise refuse("DoRA and modules_to_save are not supported")
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    shapes, layers = model_shapes(hf_config), hf_config.num_hidden_layers
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise refuse(f"unsupported weight {key!r} (only LoRA A/B of {', '.join(TARGET_MODULES)})")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in shapes:
            raise refuse(f"unknown target module {module!r}; this model has {', '.join(TARGET_MODULES)}")
        if layer >= layers:
            raise refuse(f"layer {layer} is beyond the model's {layers} layers")
        fan_in, fan_out = shapes[module]
        expected = (rank, fan_in) if half == "A" else (fan_out, rank)
        if tuple(tensor.shape) != expected:
            raise refuse(f"{key} has shape {tuple(tensor.shape)}, expected {expected} for r={rank}")
        halves.setdefault((layer, module), {})[half] = tensor
    weights = {}
    for where, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise refuse(f"layer {where[0]} {where[1]} has lora_{next(iter(pair))} without its pair")
        weights[where] = (pair["A"].float(), pair["B"].float() * scaling)
    if not weights:
        raise refuse("no LoRA weights found")
    return LoRAAdapter(request.name, rank, weights)
