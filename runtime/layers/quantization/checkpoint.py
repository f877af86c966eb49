"""What a quantized checkpoint's `quantization_config` says, read once at engine start: its method, and for each
projection how its weights are stored and its input quantized (`scheme.py`); each method's config is read by its
own module (compressed_tensors, fp8, gptq, awq); `mxfp4` is gpt-oss's experts, as OpenAI publishes them (its
projections stay unquantized: the family builds those experts itself, `runtime.models.gpt_oss`). Anything else
fails at start, naming the scheme."""

import re
from dataclasses import dataclass

from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.layers.quantization import awq, compressed_tensors, fp8, gptq
from runtime.layers.quantization.scheme import LayerScheme

SUPPORTED_METHODS = ("compressed-tensors", "fp8", "gptq", "awq", "mxfp4")


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
            scheme = {"fp8": fp8.layer_scheme, "gptq": gptq.layer_scheme, "awq": awq.layer_scheme}[method](raw)
            return cls(method, ((("Linear",), scheme),), skipped + gptq.left_out(raw.get("dynamic") or {}))
        groups = []
        for name, group in raw.get("config_groups", {}).items():
            layer = compressed_tensors.group_scheme(name, group, group.get("format") or raw.get("format"))
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
