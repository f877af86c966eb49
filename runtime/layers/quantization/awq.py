"""`awq` checkpoints (AutoAWQ's 4-bit GEMM packing), read into compressed-tensors' layout as they load
(`layout.py`)."""

from runtime.errors import InvalidInputError
from runtime.layers.quantization.scheme import LayerScheme, WeightScheme


def layer_scheme(raw: dict) -> LayerScheme:
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
