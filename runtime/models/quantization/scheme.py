"""What a quantized checkpoint's `quantization_config` says, read once at engine start: for each projection,
how its weights are stored (`WeightScheme`) and how its input is quantized on the way in (`ActivationScheme`).

Formats: compressed-tensors (what llm-compressor writes): `pack-quantized` (INT4/INT8 in int32 words, group or
channel scales, optional zero points), `int-quantized`/`naive-quantized` (INT8), `float-quantized` (FP8 e4m3
with tensor, channel or block scales); `fp8` (DeepSeek's layout, as transformers' FineGrainedFP8 writes it:
e4m3 weights with a `weight_scale_inv` per 128x128 block, computed as its dequantizing path computes them, the
inputs unquantized); `gptq` and `awq`, the older 4/8-bit layouts (AutoGPTQ's and GPTQModel's `qweight`,
`qzeros`, `scales`, `g_idx`; AutoAWQ's GEMM packing), read into compressed-tensors' layout as they load
(`layout.py`); `mxfp4` for gpt-oss's experts, as OpenAI publishes them (its projections stay unquantized: the
family builds those experts itself, `runtime.models.gpt_oss`). Anything else fails at start, naming the scheme.
"""

import re
from dataclasses import dataclass

from transformers import PretrainedConfig

from runtime.errors import InvalidInputError

SUPPORTED_METHODS = ("compressed-tensors", "fp8", "gptq", "awq", "mxfp4")
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
    layout: str = "compressed-tensors"  # or gptq (zero points stored less one), gptq_v2, awq: how tensors are laid out

    def inputs_per_scale(self, inputs: int) -> int:
        """How many of a matrix's `inputs` share a scale: the group or the block's columns, else all of them (a
        scale per channel or for the whole tensor)."""
        return {"group": self.group_size, "block": self.block and self.block[1]}.get(self.strategy) or inputs

    @property
    def legacy(self) -> bool:
        """GPTQ's or AWQ's layout: codes and zero points in int32 words, scales and zero points by input group."""
        return self.layout != "compressed-tensors"

    @property
    def checkpoint_name(self) -> str:
        """The suffix of the tensor holding the codes."""
        return "qweight" if self.legacy else "weight_packed" if self.packed else "weight"

    @property
    def zero_name(self) -> str:
        return "qzeros" if self.legacy else "weight_zero_point"

    @property
    def unused_names(self) -> tuple[str, ...]:
        """Checkpoint tensors the projection reads nothing from: a packed matrix's shape, GPTQ's input order
        (`g_idx`, checked to be the plain one as it loads) and a symmetric scheme's zero points."""
        if not self.legacy:
            return ("weight_shape",) if self.packed else ()
        return (("g_idx",) if self.layout.startswith("gptq") else ()) + (("qzeros",) if self.symmetric else ())


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
        if method in ("fp8", "gptq", "awq"):
            skipped = tuple(map(_anywhere, raw.get("modules_to_not_convert") or ()))
            scheme = {"fp8": _fp8_scheme, "gptq": _gptq_scheme, "awq": _awq_scheme}[method](raw)
            return cls(method, ((("Linear",), scheme),), skipped + _gptq_left_out(raw.get("dynamic") or {}))
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


def _gptq_scheme(raw: dict) -> LayerScheme:
    """AutoGPTQ's and GPTQModel's layout: `qweight` [inputs * bits / 32, rows] int32 (codes along the inputs),
    `scales` [groups, rows], `qzeros` [groups, rows * bits / 32] (along the rows; `gptq` stores each less one,
    `gptq_v2` as it is), `g_idx` each input's group."""
    bits, group, layout = raw.get("bits"), raw.get("group_size", -1), raw.get("checkpoint_format", "gptq")
    if bits not in (4, 8) or layout not in ("gptq", "gptq_v2"):
        what = {"bits": bits, "checkpoint_format": layout}
        raise InvalidInputError("model", f"gptq checkpoints with {what} are not supported")
    symmetric = bool(raw.get("sym", True))
    weights = WeightScheme("int", bits, "group" if group > 0 else "channel", symmetric, True,
                           group if group > 0 else None, scale_name="scales", layout=layout)
    return LayerScheme(weights, None, f"w{bits}a16" + ("" if symmetric else " asym"))


def _gptq_left_out(dynamic: dict) -> tuple[str, ...]:
    """GPTQModel's per-module rules (`dynamic`): `-:pattern` leaves the modules it matches unquantized (as `re:`
    patterns); a rule that quantizes some modules otherwise is not supported."""
    for pattern, overrides in dynamic.items():
        if not pattern.startswith("-:") and overrides:
            raise InvalidInputError("model", f"gptq checkpoints with per-module settings ({pattern!r}: {overrides}) "
                                    "are not supported")
    return tuple(f"re:{pattern[2:]}" for pattern in dynamic if pattern.startswith("-:"))


def _awq_scheme(raw: dict) -> LayerScheme:
    """AutoAWQ's GEMM layout: `qweight` [inputs, rows / 8] int32 and `qzeros` [groups, rows / 8] (along the rows,
    eight to a word in AWQ's interleaved order), `scales` [groups, rows]."""
    bits, group, version = raw.get("bits", raw.get("w_bit")), raw.get("group_size", raw.get("q_group_size")), \
        str(raw.get("version", "gemm")).lower()
    if bits != 4 or version != "gemm" or not group or group <= 0 or not raw.get("zero_point", True):
        what = {"bits": bits, "version": version, "group_size": group, "zero_point": raw.get("zero_point", True)}
        raise InvalidInputError("model", f"awq checkpoints with {what} are not supported (4-bit GEMM with zero "
                                "points only)")
    weights = WeightScheme("int", 4, "group", False, True, group, scale_name="scales", layout="awq")
    return LayerScheme(weights, None, "w4a16 asym")


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
