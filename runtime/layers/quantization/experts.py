"""Mixture-of-experts weights that stay quantized: each expert's gate/up and down projections a
`kernels.QuantizedWeight`, run expert after expert over the tokens routed to it (sorted by expert). The loop
reads the expert counts on the host, so a model with these experts decodes without CUDA graphs.

`QuantizedExperts` takes per-expert checkpoint tensors in a `Quantization`'s layout (compressed-tensors' codes,
scales and zero points; DeepSeek's FP8 `weight_scale_inv`); `quantize_experts` puts it in place of a family's
`FusedExperts` where the checkpoint holds the experts quantized. gpt-oss's MXFP4 experts
(`mxfp4_experts.py`) run through the same loop.
"""

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from kernels import QuantizedWeight
from kernels.expert_order import sort_by_expert
from runtime.distributed import expert_parallel, tp_rank, tp_size
from runtime.errors import InvalidInputError
from runtime.layers.quantization.activations import quantize_input
from runtime.layers.quantization.checkpoint import Quantization
from runtime.layers.quantization.layout import (
    check_unused,
    code_bytes,
    codes_by_row,
    codes_dtype,
    scales_by_row,
    zero_points_by_row,
)
from runtime.layers.quantization.scheme import LayerScheme


class ExpertLoop(nn.Module):
    """E gated MLPs as `QuantizedWeight`s (`gate_up` [2 I/tp, H] gate rows then up rows, `down` [H, I/tp]),
    with optional biases and input quantization."""

    cuda_graphs = False  # the expert loop syncs with the host

    def __init__(self, num_experts: int, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        if expert_parallel():
            raise InvalidInputError("enable_expert_parallel", "quantized experts run sharded over the ranks; expert "
                                    "parallelism with them is not supported yet")
        self.num_experts, self.activation = num_experts, activation
        self.gate_up: list[QuantizedWeight] = []
        self.down: list[QuantizedWeight] = []
        self.gate_up_proj_bias = self.down_proj_bias = None
        self.quantize_gate_up_input = self.quantize_down_input = None

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the weighted experts' outputs for tokens `x` [T, H] routed to `ids`."""
        tokens, top_k = ids.shape
        _, order, counts = sort_by_expert(ids, self.num_experts)
        rows = x[order // top_k]
        out = torch.empty_like(rows)
        start = 0
        for e, count in enumerate(counts.tolist()):
            if count:
                segment = rows[start : start + count]
                if self.quantize_gate_up_input is not None:
                    segment = self.quantize_gate_up_input(segment)
                hidden = self.activation(self.gate_up[e].matmul(segment, _row(self.gate_up_proj_bias, e)))
                if self.quantize_down_input is not None:
                    hidden = self.quantize_down_input(hidden)
                out[start : start + count] = self.down[e].matmul(hidden, _row(self.down_proj_bias, e))
            start += count
        out = out * weights.flatten()[order, None].to(out.dtype)
        unsorted = torch.empty_like(out)
        unsorted[order] = out
        return unsorted.view(tokens, top_k, -1).sum(dim=1)


def _row(bias: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if bias is None else bias[expert]


class QuantizedExperts(ExpertLoop):
    """Per-expert quantized tensors, loaded into stacked parameters named as the checkpoint's suffixes say
    (`gate_up_proj_weight_packed`, `down_proj_weight_scale`, ...; the codes of an unpacked scheme fill
    `gate_up_proj` and `down_proj`), this rank's slice of every expert's intermediate features: gate and up
    rows, down's input groups."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 activation: Callable[[torch.Tensor], torch.Tensor], scheme: LayerScheme):
        super().__init__(num_experts, activation)
        w = scheme.weights
        self.scheme, self.hidden, self.intermediate = scheme, hidden_size, intermediate_size
        self.shard = intermediate_size // tp_size()
        self.groups = {"gate_up_proj": w.inputs_per_scale(hidden_size), "down_proj": w.inputs_per_scale(self.shard)}
        if self.shard % self.groups["down_proj"] or (w.packed and self.shard % (32 // w.bits)):
            raise InvalidInputError("model", f"quantized experts' {self.shard} intermediate features per rank do "
                                    f"not split into whole groups of {self.groups['down_proj']}")
        for proj, (rows, inputs) in {"gate_up_proj": (2 * self.shard, hidden_size),
                                     "down_proj": (hidden_size, self.shard)}.items():
            width = inputs * w.bits // 32 if w.packed else inputs
            self._register(proj, w.checkpoint_name, (num_experts, rows, width), codes_dtype(w))
            groups = inputs // self.groups[proj]
            self._register(proj, w.scale_name, (num_experts, rows, groups), torch.float32)
            if not w.symmetric:
                self._register(proj, w.zero_name, (num_experts, rows, groups), torch.float32)
            for unused in w.unused_names:
                self._register(proj, unused, (0,), torch.int32)

    def _register(self, proj: str, suffix: str, shape: tuple, dtype: torch.dtype) -> None:
        param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        param.weight_loader = partial(self.weight_loader, proj=proj, suffix=suffix)
        self.register_parameter(proj if suffix == "weight" else f"{proj}_{suffix}", param)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, expert: int, half: int | None = None, *,
                      proj: str, suffix: str) -> None:
        """One expert's tensor: gate's or up's (`half` 0 or 1) rows of this rank, or down's input groups."""
        w, start = self.scheme.weights, tp_rank() * self.shard
        rows, columns = (self.intermediate, self.hidden) if proj == "gate_up_proj" else (self.hidden,
                                                                                           self.intermediate)
        if suffix in w.unused_names:
            check_unused(suffix, loaded, w)
            return
        group = self.groups[proj]
        if suffix == w.zero_name:
            loaded = zero_points_by_row(loaded, rows, columns, group, w)
        elif suffix == w.scale_name:
            loaded = scales_by_row(loaded, rows, columns, group, w)
        else:
            loaded = codes_by_row(loaded, rows, columns, w)
        if proj == "gate_up_proj":
            param.data[expert, half * self.shard : (half + 1) * self.shard].copy_(loaded[start : start + self.shard])
        else:  # the inputs of this rank: in codes (several to an int32 word when packed), or in groups
            per_column = (32 // w.bits if w.packed else 1) if suffix == w.checkpoint_name else group
            param.data[expert].copy_(loaded[:, start // per_column : (start + self.shard) // per_column])

    def pack(self) -> None:
        """After loading: each expert's projections as `QuantizedWeight`s (and the inputs' quantization), the
        loading parameters dropped."""
        w = self.scheme.weights
        for proj, into in (("gate_up_proj", self.gate_up), ("down_proj", self.down)):
            codes, scale = self._take(proj, w.checkpoint_name), self._take(proj, w.scale_name)
            zero = None if w.symmetric else self._take(proj, w.zero_name)
            for e in range(self.num_experts):
                into.append(QuantizedWeight.build(code_bytes(codes[e]), w.type, w.bits, scale[e],
                                                  None if zero is None else zero[e]))
            for unused in w.unused_names:
                self._take(proj, unused)
        activations = self.scheme.activations
        if activations is not None:
            self.quantize_gate_up_input = partial(quantize_input, scheme=activations, input_scale=None)
            self.quantize_down_input = partial(quantize_input, scheme=activations, input_scale=None,
                                               split_inputs=tp_size() > 1)

    def _take(self, proj: str, suffix: str) -> torch.Tensor:
        name = proj if suffix == "weight" else f"{proj}_{suffix}"
        data = getattr(self, name).data
        delattr(self, name)
        return data


def quantize_experts(model: nn.Module, quantization: Quantization, tensor_names: set[str]) -> None:
    """Put `QuantizedExperts` in place of each `FusedExperts` whose experts the checkpoint holds quantized."""
    from runtime.layers.moe import FusedExperts  # the families' module imports this package

    gate = getattr(model, "expert_names", ("gate_proj",))[0]
    for name, module in list(model.named_modules()):
        if not isinstance(module, FusedExperts):
            continue
        scheme = quantization.scheme_for(f"{name}.0.{gate}")
        if scheme is None or f"{name}.0.{gate}.{scheme.weights.scale_name}" not in tensor_names:
            continue
        if module.gate_up_proj_bias is not None or (scheme.activations and not scheme.activations.dynamic):
            raise InvalidInputError("model", f"{name}: quantized experts with biases or static input scales are "
                                    "not supported")
        parent, leaf = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), leaf, QuantizedExperts(
            module.num_experts, module.gate_up_proj.shape[1], module.shard * tp_size(), module.activation, scheme))
