"""compressed-tensors checkpoints (what llm-compressor writes): `pack-quantized` (INT4/INT8 in int32 words, group
or channel scales, optional zero points), `int-quantized`/`naive-quantized` (INT8), `float-quantized` (FP8 e4m3
with tensor, channel or block scales), each config group with its weights' and optionally its inputs' scheme."""

from runtime.errors import InvalidInputError
from runtime.layers.quantization.scheme import ActivationScheme, LayerScheme, WeightScheme

FORMATS = {"pack-quantized", "int-quantized", "naive-quantized", "float-quantized"}


def group_scheme(group_name: str, group: dict, fmt: str | None) -> LayerScheme:
    def refuse(why: str):
        raise InvalidInputError("model", f"compressed-tensors group {group_name!r}: {why} is not supported")

    if fmt not in FORMATS:
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
