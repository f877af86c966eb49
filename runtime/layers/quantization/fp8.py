"""`fp8` checkpoints in DeepSeek's layout, as transformers' FineGrainedFP8 writes them: e4m3 weights with a
`weight_scale_inv` per 128x128 block, computed as its dequantizing path computes them, the inputs unquantized."""

from runtime.errors import InvalidInputError
from runtime.layers.quantization.scheme import LayerScheme, WeightScheme


def layer_scheme(raw: dict) -> LayerScheme:
    """DeepSeek's FP8 layout: e4m3 weights, a `weight_scale_inv` per block of `weight_block_size`."""
    block = raw.get("weight_block_size")
    if not block or len(block) != 2 or raw.get("activation_scheme", "dynamic") != "dynamic":
        raise InvalidInputError("model", f"fp8 checkpoints without 2-d block scales are not supported yet: {raw}")
    weights = WeightScheme("float", 8, "block", True, False, block=tuple(block), scale_name="weight_scale_inv")
    return LayerScheme(weights, None, "fp8 block")
