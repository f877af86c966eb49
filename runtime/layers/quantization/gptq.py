"""`gptq` checkpoints (AutoGPTQ's and GPTQModel's 4/8-bit `qweight`, `qzeros`, `scales`, `g_idx`), read into
compressed-tensors' layout as they load (`layout.py`)."""

from runtime.errors import InvalidInputError
from runtime.layers.quantization.scheme import LayerScheme, WeightScheme


def layer_scheme(raw: dict) -> LayerScheme:
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


def left_out(dynamic: dict) -> tuple[str, ...]:
    """GPTQModel's per-module rules (`dynamic`): `-:pattern` leaves the modules it matches unquantized (as `re:`
    patterns); a rule that quantizes some modules otherwise is not supported."""
    for pattern, overrides in dynamic.items():
        if not pattern.startswith("-:") and overrides:
            raise InvalidInputError("model", f"gptq checkpoints with per-module settings ({pattern!r}: {overrides}) "
                                    "are not supported")
    return tuple(f"re:{pattern[2:]}" for pattern in dynamic if pattern.startswith("-:"))
