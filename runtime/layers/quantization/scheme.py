"""How a quantized projection is stored and run, whatever the method wrote it: its weights (`WeightScheme`) and
how its input is quantized on the way in (`ActivationScheme`)."""

from dataclasses import dataclass


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


