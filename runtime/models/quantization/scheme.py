"""What a quantized checkpoint's `quantization_config` says, read once at engine start: for each projection,
how its weights are stored (`WeightScheme`) and how its input is quantized on the way in (`ActivationScheme`).

Formats: compressed-tensors (what llm-compressor writes): `pack-quantized` (INT4/INT8 in int32 words, group or
channel scales, optional zero points), `int-quantized`/`naive-quantized` (INT8), `float-quantized` (FP8 e4m3
with tensor, channel or block scales); `fp8` (DeepSeek's layout, as transformers' FineGrainedFP8 writes it:
e4m3 weights with a `weight_scale_inv` per 128x128 block, computed as its dequantizing path computes them, the
inputs unquantized); `mxfp4` for gpt-oss's experts, as OpenAI publishes them (its projections
stay unquantized: the family builds those experts itself, `runtime.models.gpt_oss`). Anything else fails at
start, naming the scheme.
"""

import re
from dataclasses import dataclass

from transformers import PretrainedConfig

from runtime.errors import InvalidInputError

SUPPORTED_METHODS = ("compressed-tensors", "fp8", "mxfp4")
_FORMATS = {"pack-quantized", "int-quantized", "naive-quantized", "float-quantized"}


@dataclass(frozen=True)
class WeightScheme:
    type: str  # int | float
    bits: int  # 4 or 8
    strategy: str  # tensor | channel | group | block
    symmetric: bool
    packed: bool  # int32 words holding 32 / bits values along the input dimension (`weight_packed`)
    group_size: int | None = None  # inputs per scale (group)
    block: tuple[int, int] | None = None  # [rows, columns] per scale (block)
    scale_name: str = "weight_scale"  # the scales' tensor (DeepSeek's FP8 layout: `weight_scale_inv`)

    def inputs_per_scale(self, inputs: int) -> int:
        """How many of a matrix's `inputs` share a scale: the group or the block's columns, else all of them (a
        scale per channel or for the whole tensor)."""
        return {"group": self.group_size, "block": self.block and self.block[1]}.get(self.strategy) or inputs

    @property
    def checkpoint_name(self) -> str:
        """The suffix of the tensor holding the codes."""
        return "weight_packed" if self.packed else "weight"


@dataclass(frozen=True)
class ActivationScheme:
    type: str  # int | float
    strategy: str  # token | group | tensor
    dynamic: bool  # scales from each input (else the checkpoint's `input_scale`)
    group_size: int | None = None


@dataclass(frozen=True)
class LayerScheme:
    weights: WeightScheme
    activations: ActivationScheme | None
    label: str  # what /v1/models and the logs call it ("w4a16", "fp8 block", ...)


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization: which projections it covers, and how."""

    method: str
    groups: tuple[tuple[tuple[str, ...], LayerScheme], ...]  # (targets, scheme) in the config's order
    ignore: tuple[str, ...]

    @classmethod
    def from_config(cls, hf_config: PretrainedConfig, requested: str | None = None) -> "Quantization | None":
        """The checkpoint's quantization (None for an unquantized one); `requested` (the `quantization` engine
        option) must name the method the checkpoint has. InvalidInputError for anything this engine cannot run."""
        raw = _raw_config(hf_config)
        method = raw.get("quant_method", "unnamed") if raw else None
        if requested and requested != method:
            raise InvalidInputError("quantization", f"{requested!r} was asked for, but the checkpoint is "
                                    f"{method or 'not quantized'}")
        if not raw:
            return None
        if method not in SUPPORTED_METHODS:
            raise InvalidInputError("model", f"quantization method {method!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED_METHODS)}")
        if method == "mxfp4":
            if hf_config.model_type != "gpt_oss":
                raise InvalidInputError("model", "mxfp4 checkpoints are supported for gpt-oss only")
            return cls(method, (), ())
        if method == "fp8":
            skipped = raw.get("modules_to_not_convert") or ()
            return cls(method, ((("Linear",), _fp8_scheme(raw)),), tuple(map(_anywhere, skipped)))
        groups = []
        for name, group in raw.get("config_groups", {}).items():
            layer = _layer_scheme(name, group, group.get("format") or raw.get("format"))
            groups.append((tuple(group.get("targets", ())), layer))
        if raw.get("kv_cache_scheme"):
            raise InvalidInputError("model", "compressed-tensors' kv_cache_scheme is not supported yet")
        return cls(method, tuple(groups), tuple(raw.get("ignore") or ()))

    @property
    def label(self) -> str:
        """The schemes, for /v1/models: "compressed-tensors (w4a16)", "mxfp4 (experts)"."""
        labels = sorted({layer.label for _, layer in self.groups}) or ["experts"]
        return f"{self.method} ({', '.join(labels)})"

    def scheme_for(self, name: str) -> LayerScheme | None:
        """The scheme of the linear module the checkpoint calls `name`, or None where it stays unquantized."""
        if any(_matches(pattern, name) for pattern in self.ignore):
            return None
        for targets, layer in self.groups:
            if any(_matches(target, name) for target in targets):
                return layer
        return None


def is_mxfp4(hf_config: PretrainedConfig) -> bool:
    """Whether the checkpoint's experts are MXFP4 (gpt-oss as OpenAI publishes it)."""
    raw = _raw_config(hf_config)
    return bool(raw) and raw.get("quant_method") == "mxfp4"


def _raw_config(hf_config: PretrainedConfig) -> dict | None:
    """`quantization_config` as a dict (transformers may hold it as its own config object)."""
    raw = getattr(hf_config, "quantization_config", None)
    return raw if raw is None or isinstance(raw, dict) else raw.to_dict()


def _anywhere(module: str) -> str:
    """transformers' `modules_to_not_convert` entry (a part of a module name, `*` any text) as a `re:` pattern."""
    return "re:.*" + ".*".join(map(re.escape, module.split("*")))


def _matches(pattern: str, name: str) -> bool:
    """compressed-tensors' matching: `re:` a regex over the module name, else the module name itself, or a
    module class (every projection is a `Linear`)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern in ("Linear", name) or name.endswith(f".{pattern}")


def _fp8_scheme(raw: dict) -> LayerScheme:
    """DeepSeek's FP8 layout: e4m3 weights, a `weight_scale_inv` per block of `weight_block_size`."""
    block = raw.get("weight_block_size")
    if not block or len(block) != 2 or raw.get("activation_scheme", "dynamic") != "dynamic":
        raise InvalidInputError("model", f"fp8 checkpoints without 2-d block scales are not supported yet: {raw}")
    weights = WeightScheme("float", 8, "block", True, False, block=tuple(block), scale_name="weight_scale_inv")
    return LayerScheme(weights, None, "fp8 block")


def _layer_scheme(group_name: str, group: dict, fmt: str | None) -> LayerScheme:
    def refuse(why: str):
        raise InvalidInputError("model", f"compressed-tensors group {group_name!r}: {why} is not supported")

    if fmt not in _FORMATS:
        refuse(f"format {fmt!r}")
    w = group.get("weights")
    if not w:
        refuse("a group without weight quantization")
    if w.get("dynamic") or w.get("actorder") == "group" or w.get("type") not in ("int", "float"):
        refuse(f"weights {w}")
    bits, strategy, kind = w["num_bits"], w["strategy"], w["type"]
    if (kind, bits) not in (("int", 4), ("int", 8), ("float", 8)) or strategy not in ("tensor", "channel",
                                                                                          "group", "block"):
        refuse(f"{bits}-bit {kind} weights by {strategy}")
    if kind == "float" and not w.get("symmetric", True):
        refuse("asymmetric FP8")
    weights = WeightScheme(kind, bits, strategy, bool(w.get("symmetric", True)), fmt == "pack-quantized",
                           w.get("group_size") if strategy == "group" else None,
                           tuple(w["block_structure"]) if strategy == "block" else None)
    a = group.get("input_activations")
    activations = None
    if a:
        if a.get("type") not in ("int", "float") or a.get("num_bits") != 8 or not a.get("symmetric", True) \
                or a.get("strategy") not in ("token", "group", "tensor") or (a.get("strategy") != "tensor"
                                                                             and not a.get("dynamic")):
            refuse(f"input activations {a}")
        activations = ActivationScheme(a["type"], a["strategy"], bool(a.get("dynamic")), a.get("group_size"))
    name = "fp8" if kind == "float" else f"w{bits}a{8 if activations else 16}"
    if kind == "float":
        name += f" {strategy}" + ("" if activations else " w8a16")
    elif not weights.symmetric:
        name += " asym"
    return LayerScheme(weights, activations, name)
