"""Projections that keep a quantized checkpoint's weights quantized, and `quantize_model`, which prepares a
whole model before loading: its projections here, its MoE experts (`experts.py`), and the matrices a family
reads whole rather than multiplies through (DeepSeek's latent `kv_b_proj`), dequantized once as they load.

Before loading, `quantize_linears` gives each projection the checkpoint quantizes parameters shaped as its
tensors (the codes, `weight_scale`, `weight_zero_point`, ...) in place of `weight`. Each parameter's loader
brings the checkpoint tensor to rows first (a block's or the tensor's scale repeated over its rows, zero
points unpacked), so the projection's own loader then shards it as it shards a weight: column-parallel
layers by output row, row-parallel ones by input group. After loading, `finish_quantized_linears` turns them
into the `kernels.QuantizedWeight` the projection multiplies by.
"""

from functools import partial

import torch
from torch import nn

from kernels import QuantizedWeight
from runtime.distributed import tp_size
from runtime.errors import InvalidInputError
from runtime.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    _Linear,
)
from runtime.layers.quantization.activations import quantize_input
from runtime.layers.quantization.checkpoint import Quantization
from runtime.layers.quantization.experts import quantize_experts
from runtime.layers.quantization.layout import (
    check_unused,
    code_bytes,
    codes_by_row,
    codes_dtype,
    scales_by_row,
    zero_points_by_row,
)
from runtime.layers.quantization.scheme import LayerScheme


def quantize_model(model: nn.Module, quantization: Quantization, tensor_names: set[str]) -> None:
    """Before loading: the projections and MoE experts the checkpoint (`tensor_names`) holds quantized get
    quantized parameters."""
    quantize_linears(model, quantization, tensor_names)
    quantize_experts(model, quantization, tensor_names)
    for name, module in model.named_modules():
        scheme = _checkpoint_scheme(quantization, name, tensor_names)
        if getattr(module, "dequantized_at_load", False) and scheme is not None:
            _dequantize_at_load(module, scheme)


def quantize_linears(model: nn.Module, quantization: Quantization, tensor_names: set[str]) -> None:
    """Give every projection that `quantization` covers, and whose tensors the checkpoint (`tensor_names`) holds
    quantized, its quantized parameters (before loading). A target names a module class (`Linear`), and a module
    we run as a projection may not have been one where the checkpoint was quantized (transformers 5's MoE
    routers): such a module's tensor is plain, and it loads as one."""
    parts_of: dict[str, list[str]] = {}
    for part, (fused, _) in model.stacked_params.items():
        parts_of.setdefault(fused, []).append(part)
    if model.lm_head is not None and tensor_names & {f"lm_head.{layer.weights.scale_name}"
                                                     for _, layer in quantization.groups}:
        raise InvalidInputError("model", "a quantized LM head is not supported")
    for name, module in model.named_modules():
        if not isinstance(module, _Linear):
            continue
        prefix, leaf = name.rsplit(".", 1)
        names = [f"{prefix}.{part}" for part in parts_of.get(leaf, [leaf])]
        schemes = {_checkpoint_scheme(quantization, n, tensor_names) for n in names}
        if len(schemes) > 1:
            raise InvalidInputError("model", f"{', '.join(names)} are quantized differently; they run as one "
                                    "projection")
        scheme = schemes.pop()
        if scheme is not None:
            _quantize(module, scheme, name)


def _checkpoint_scheme(quantization: Quantization, name: str, tensor_names: set[str]) -> LayerScheme | None:
    """`name`'s scheme where the checkpoint holds its scales, else None."""
    scheme = quantization.scheme_for(name)
    return scheme if scheme and f"{name}.{scheme.weights.scale_name}" in tensor_names else None


def finish_quantized_linears(model: nn.Module) -> None:
    """After loading: each quantized projection's `QuantizedWeight` (and its input's quantization), its loading
    parameters dropped."""
    for module in model.modules():
        scheme: LayerScheme | None = getattr(module, "scheme", None)
        if not isinstance(module, _Linear) or scheme is None:
            continue
        w = scheme.weights
        codes = code_bytes(getattr(module, w.checkpoint_name).data)
        zero = getattr(module, w.zero_name, None)
        module.quantized = QuantizedWeight.build(codes, w.type, w.bits, getattr(module, w.scale_name).data,
                                                 None if zero is None else zero.data)
        if scheme.activations is not None:
            scale = getattr(module, "input_scale", None)
            module.quantize_input = partial(quantize_input, scheme=scheme.activations,
                                            input_scale=None if scale is None else scale.data,
                                            split_inputs=isinstance(module, RowParallelLinear) and tp_size() > 1)
        for name in list(module._parameters):
            if name != "bias":
                delattr(module, name)
        module.weight = None


def _quantize(module: _Linear, scheme: LayerScheme, name: str) -> None:
    w = scheme.weights
    out, local_in = module.matrix_shape
    row_parallel = isinstance(module, RowParallelLinear)
    full_in = local_in * (tp_size() if row_parallel else 1)
    group = w.inputs_per_scale(local_in)
    if local_in % group or (w.packed and local_in % (32 // w.bits)):
        raise InvalidInputError("model", f"{name}: {local_in} inputs per rank do not split into whole groups of "
                                f"{group} (tensor_parallel_size {tp_size()})")
    width = local_in * w.bits // 32 if w.packed else local_in
    delattr(module, "weight")
    module.scheme = scheme
    loader = module.weight_loader

    def register(param_name: str, shape: tuple, dtype: torch.dtype, prepare=None, load=None) -> None:
        """A parameter that `load`s its tensors, or passes them (through `prepare`) to the projection's loader."""
        param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)

        def shard_and_load(p, loaded, *shard):
            loader(p, loaded if prepare is None else prepare(loaded, *_part_shape(module, full_in, *shard)), *shard)

        param.weight_loader = load or shard_and_load
        module.register_parameter(param_name, param)

    register(w.checkpoint_name, (out, width), codes_dtype(w), partial(codes_by_row, weights=w))
    register(w.scale_name, (out, local_in // group), torch.float32, partial(scales_by_row, group=group, weights=w))
    if not w.symmetric:
        register(w.zero_name, (out, local_in // group), torch.float32,
                 partial(zero_points_by_row, group=group, weights=w))
    for unused in w.unused_names:
        register(unused, (0,), torch.int32,
                 load=lambda p, loaded, *shard, unused=unused: check_unused(unused, loaded, w))
    if scheme.activations is not None and not scheme.activations.dynamic:  # fused parts share the largest
        register("input_scale", (1,), torch.float32,
                 load=lambda p, loaded, *shard: p.data.copy_(torch.maximum(p.data, loaded.float().reshape(1))))


def _dequantize_at_load(module: nn.Module, scheme: LayerScheme) -> None:
    """A matrix read whole rather than multiplied through (DeepSeek's latent `kv_b_proj`, which attention
    splits per head): its quantized tensors are held as they load, then dequantized into its float `weight`
    (rows sharded by its own loader)."""
    w = scheme.weights
    rows, columns = module.checkpoint_shape
    group = w.inputs_per_scale(columns)
    loader, held = module.weight.weight_loader, {}

    def hold(name: str, p, loaded):
        held[name] = loaded
        if {w.checkpoint_name, w.scale_name} | ({w.zero_name} if not w.symmetric else set()) <= held.keys():
            zero = held.get(w.zero_name)
            matrix = QuantizedWeight.build(
                code_bytes(codes_by_row(held[w.checkpoint_name], rows, columns, w)), w.type, w.bits,
                scales_by_row(held[w.scale_name], rows, columns, group, w),
                None if zero is None else zero_points_by_row(zero, rows, columns, group, w)).dequantize()
            loader(module.weight, matrix)  # this rank's rows

    names = {w.checkpoint_name, w.scale_name, *(() if w.symmetric else (w.zero_name,)), *w.unused_names}
    if "weight" not in names:  # no checkpoint tensor fills it: a buffer the held tensors fill
        weight = module.weight.data
        del module._parameters["weight"]
        module.register_buffer("weight", weight)
    for name in names:
        if name != "weight":  # empty: the tensors are held until the matrix is whole
            module.register_parameter(name, nn.Parameter(torch.zeros(0), requires_grad=False))
        getattr(module, name).weight_loader = partial(hold, name)


def _part_shape(module: _Linear, full_in: int, shard=None) -> tuple[int, int]:
    """The checkpoint's [rows, columns] for the part `shard` of `module` (all of it for None)."""
    if isinstance(module, QKVParallelLinear):
        sizes = dict(zip("qkv", module.checkpoint_sizes))
        return (sum(sizes.values()) if shard is None else sizes[shard]), full_in
    if isinstance(module, MergedColumnParallelLinear):
        return (sum(module.out_features) if shard is None else module.out_features[shard]), full_in
    rows = module.matrix_shape[0] * (tp_size() if isinstance(module, ColumnParallelLinear) else 1)
    return rows, full_in
