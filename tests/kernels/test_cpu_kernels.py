"""The C++ CPU kernels: each equals its torch reference, and they are built once per machine, or
replaced by the reference where no compiler works."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kernels import (
    QuantizedWeight,
    apply_rotary,
    argmax,
    choose_attention_backend,
    code_table,
    linear,
    pack_weight,
    rms_norm,
    sample,
    silu_and_mul,
)
from kernels.activation import silu_and_mul_reference
from kernels.cpu import attention as cpu_attention
from kernels.cpu import build, elementwise, grouped_matmul
from kernels.cpu import gated_delta as cpu_gated_delta
from kernels.cpu import sampling as cpu_sampling
from kernels.gated_delta import causal_conv1d, gated_delta_rule, gated_delta_rule_reference
from kernels.moe import fused_experts, fused_experts_reference
from kernels.norm import rms_norm_reference
from kernels.rotary import apply_rotary_reference
from kernels.sampling import sample_reference


@pytest.mark.parametrize("rows", [3, 700])  # one thread, and spread over threads
def test_rms_norm_with_and_without_residual(rows):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(rows, 96), torch.randn(rows, 96), torch.randn(96)
    assert elementwise.applies(x)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))
    got, got_residual = rms_norm(x, weight, 1e-6, residual)
    expected, expected_residual = rms_norm_reference(x, weight, 1e-6, residual)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got_residual, expected_residual)
    per_head = torch.randn(rows, 4, 32)  # Qwen3's q/k norm: one vector per head
    torch.testing.assert_close(rms_norm(per_head, weight[:32], 1e-6), rms_norm_reference(per_head, weight[:32], 1e-6))


@pytest.mark.parametrize("tokens", [5, 300])
def test_rotary_on_views_of_the_fused_projection(tokens):
    torch.manual_seed(0)
    qkv = torch.randn(tokens, (8 + 2 + 2) * 64)
    q, k, _ = qkv.split([8 * 64, 2 * 64, 2 * 64], dim=-1)
    q, k = q.view(tokens, 8, 64), k.view(tokens, 2, 64)  # rows 768 floats apart, as the model passes them
    angles = torch.rand(tokens, 32) * 100
    got = apply_rotary(q, k, angles.cos(), angles.sin())
    expected = apply_rotary_reference(q, k, angles.cos(), angles.sin())
    for g, e in zip(got, expected):
        assert g.is_contiguous()
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("tokens", [2, 64])
def test_silu_and_mul_over_the_whole_range(tokens):
    torch.manual_seed(0)
    gate_up = torch.randn(tokens, 2 * 1536) * 30  # far into both tails, where e^-x would overflow
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 88.0, -80.0])
    torch.testing.assert_close(silu_and_mul(gate_up), silu_and_mul_reference(gate_up), atol=1e-30, rtol=1e-6)


@pytest.mark.parametrize("out_dim", [32, 96])
def test_grouped_matmul_equals_a_matmul_per_expert(out_dim):
    """Segments of 0 to 13 rows (blocks of 6 and every remainder), gathered through an index or read in place."""
    torch.manual_seed(0)
    counts, inner = [13, 0, 1, 6, 2, 0, 5, 3, 4], 40
    ends = torch.tensor(counts).cumsum(0)
    x, weight = torch.randn(50, inner), torch.randn(len(counts), inner, out_dim)
    index = torch.randint(0, 50, (sum(counts),))
    packed = grouped_matmul.pack(weight)
    starts = [0, *ends.tolist()[:-1]]
    expected = torch.cat([x[index][s:e] @ w for s, e, w in zip(starts, ends.tolist(), weight)])
    torch.testing.assert_close(grouped_matmul.grouped_matmul(x[index], packed, ends), expected)
    torch.testing.assert_close(grouped_matmul.grouped_matmul(x, packed, ends, index), expected)
    bias, scale, to = torch.randn(len(counts), out_dim), torch.rand(sum(counts)), torch.randperm(sum(counts))
    row_experts = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    moved = torch.empty_like(expected)
    moved[to] = (expected + bias[row_experts]) * scale[:, None]
    torch.testing.assert_close(grouped_matmul.grouped_matmul(x, packed, ends, index, bias, scale, to), moved)
    assert grouped_matmul.pack(weight[..., :24]) is None  # a width off the tile: torch's grouped_mm
    assert grouped_matmul.pack(weight.double()) is None


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_linear_through_packed_tiles_and_onednn(rows):
    """A width the tiles serve goes through them (4-d packed), one they do not through oneDNN (2-d)."""
    torch.manual_seed(0)
    x = torch.randn(rows, 40)
    for out_features, dims in ((96, 4), (24, 2)):
        weight, bias = torch.randn(out_features, 40), torch.randn(out_features)
        packed = pack_weight(weight)
        assert packed.dim() == dims
        torch.testing.assert_close(linear(x, None, bias, packed), torch.nn.functional.linear(x, weight, bias))


@pytest.mark.parametrize("kind,bits,group,zeros", [("int", 4, 32, False), ("int", 4, 64, True), ("int", 8, 96, False),
                                                   ("float", 8, 32, False), ("float", 4, 32, False)])
def test_quantized_matmul_dequantizes_each_tile_as_the_whole_matrix(kind, bits, group, zeros):
    """The C++ kernel's tiles (codes two to a byte for 4 bits, scales and zero points per tile) against the torch
    path's dequantized matrix, for every count of rows a block of the kernel takes and more."""
    torch.manual_seed(0)
    out, inner = 64, 192
    codes = torch.randint(0, 256, (out, inner * bits // 8), dtype=torch.uint8)
    if kind == "float" and bits == 8:  # no NaN codes
        codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    scale = torch.rand(out, inner // group) + 0.5
    zero = torch.randint(-8, 8, (out, inner // group)).float() if zeros else None
    weight = QuantizedWeight.build(codes, kind, bits, scale, zero)
    plain = QuantizedWeight(codes, bits, code_table(kind, bits), kind == "float", scale, zero, out, inner)
    assert weight.packed and not plain.packed
    torch.testing.assert_close(weight.dequantize(), plain.dequantize(), atol=0, rtol=0)
    bias = torch.randn(out)
    for rows in [1, 5, 6, 7, 13]:
        x = torch.randn(rows, inner)
        expected = (x.double() @ plain.dequantize().double().T + bias).float()  # sums of a few hundred terms
        torch.testing.assert_close(weight.matmul(x, bias), expected, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_experts_over_packed_weights_equal_the_reference(bias):
    torch.manual_seed(0)
    x, weights, ids = torch.randn(9, 64), torch.rand(9, 3), torch.randint(0, 4, (9, 3))
    gate_up, down = torch.randn(4, 64, 64) * 0.1, torch.randn(4, 32, 64) * 0.1
    biases = (torch.randn(4, 64), torch.randn(4, 64)) if bias else (None, None)
    packed = grouped_matmul.pack(gate_up), grouped_matmul.pack(down)
    got = fused_experts(x, weights, ids, None, None, silu_and_mul, *biases, packed=packed)
    expected = fused_experts_reference(x, weights, ids, gate_up, down, silu_and_mul, *biases)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [5, 64])  # one thread, and spread over threads
def test_argmax_as_torch_with_ties_infinities_and_nans(rows):
    torch.manual_seed(0)
    logits = torch.randn(rows, 8192)
    logits[0, [7, 4000]] = 9.0  # a tie: the first
    logits[1] = float("-inf")
    logits[2, [10, 20]] = torch.tensor([float("inf"), float("nan")])  # NaN beats inf
    logits[3, [100, 50]] = float("nan")  # the first NaN
    logits[4, -1] = 50.0
    assert torch.equal(argmax(logits), logits.argmax(dim=-1))


def test_arguments_the_kernels_do_not_take_go_to_the_reference():
    """Other dtypes, broadcast shapes, strided or 3-d inputs: what torch would accept still gives its answer."""
    torch.manual_seed(0)
    x, weight, row, strided = torch.randn(4, 32), torch.randn(32), torch.randn(32), torch.randn(64)[::2]
    cases = [
        (lambda f: f(x, weight.bfloat16(), 1e-6), rms_norm, rms_norm_reference),
        (lambda f: f(x, weight, 1e-6, row), rms_norm, rms_norm_reference),  # one residual row for every row
        (lambda f: f(x, strided, 1e-6), rms_norm, rms_norm_reference),
    ]
    q, k, angles = torch.randn(3, 4, 16), torch.randn(3, 2, 16), torch.rand(1, 8)  # one position for all tokens
    gate_up = torch.randn(2, 3, 8)
    cases += [
        (lambda f: f(q, k.bfloat16(), angles.cos(), angles.sin()), apply_rotary, apply_rotary_reference),
        (lambda f: f(q, k, angles.cos(), angles.sin()), apply_rotary, apply_rotary_reference),
        (lambda f: f(gate_up), silu_and_mul, silu_and_mul_reference),
    ]
    for call, kernel, reference in cases:
        got, expected = call(kernel), call(reference)
        for g, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, expected)), strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e)


def test_the_cpu_kernel_is_built_once_per_source_and_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYLLM_KERNEL_CACHE", str(tmp_path / "cache"))
    source = Path(build.__file__).with_name("attention.cpp")
    first = build.build(source, ["g++"])
    stamp = first.stat().st_mtime_ns
    assert build.build(source, ["g++"]) == first and first.stat().st_mtime_ns == stamp
    edited = tmp_path / "attention.cpp"
    edited.write_text(source.read_text() + "\n// edited\n")
    (tmp_path / "vector_math.h").write_bytes(source.with_name("vector_math.h").read_bytes())
    assert build.build(edited, ["g++"]) != first
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".so", ".so"]  # no partial files left


def test_builds_started_together_all_succeed(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYLLM_KERNEL_CACHE", str(tmp_path))
    source = Path(build.__file__).with_name("elementwise.cpp")
    with ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: build.build(source, ["g++"]), range(4)))
    assert len(paths) == 1 and [p.name for p in tmp_path.iterdir()] == [paths.pop().name]


def test_without_a_compiler_the_cpu_backend_falls_back_to_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("RAYLLM_KERNEL_CACHE", str(tmp_path))
    build.load.cache_clear()
    cpu_attention._kernel.cache_clear()
    try:
        assert choose_attention_backend("auto", "cpu", torch.float32, 64).name == "torch"
        with pytest.raises(ValueError, match="C\\+\\+ compiler"):
            choose_attention_backend("cpu", "cpu", torch.float32, 64)
    finally:
        monkeypatch.undo()
        build.load.cache_clear()
        cpu_attention._kernel.cache_clear()
    assert choose_attention_backend("auto", "cpu", torch.float32, 64).name == "cpu"
    assert choose_attention_backend("auto", "cpu", torch.bfloat16, 64).name == "torch"
    assert choose_attention_backend("auto", "cpu", torch.float32, 8).name == "torch"


def gated_delta_case(value_dim: int = 24) -> tuple:
    """A step of two decodes and two prefill chunks (7 and 3 tokens) over a pool of 5 states, 2 key heads with
    2 value heads each: the arguments of `gated_delta_rule`."""
    torch.manual_seed(0)
    tokens, key_heads, value_heads, key_dim = 12, 2, 4, 16
    q = torch.nn.functional.normalize(torch.randn(tokens, key_heads, key_dim), dim=-1) * key_dim**-0.5
    k = torch.nn.functional.normalize(torch.randn(tokens, key_heads, key_dim), dim=-1)
    v, g, beta = torch.randn(tokens, value_heads, value_dim), -torch.rand(tokens, value_heads), torch.rand(tokens, 4)
    states = torch.randn(5, value_heads, key_dim, value_dim)
    return q, k, v, g, beta, states, torch.tensor([3, 0, 4, 1]), torch.tensor([0, 1, 2, 9, 12])


def test_gated_delta_rule_over_decodes_and_prefill_chunks():
    q, k, v, g, beta, states, slots, cu_seqlens = gated_delta_case()
    assert cpu_gated_delta.applies(q, k, v, g, beta, states)
    expected_states = states.clone()
    expected = gated_delta_rule_reference(q, k, v, g, beta, expected_states, slots, cu_seqlens)
    torch.testing.assert_close(gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens), expected)
    torch.testing.assert_close(states, expected_states)
    assert torch.equal(states[2], gated_delta_case()[5][2])  # a slot no sequence uses is left alone


def test_causal_conv1d_in_chunks_equals_one_pass():
    """A sequence convolved in a chunk of 5, a chunk of 2 and three decodes, resuming its state, equals the
    whole sequence at once; a second sequence in the same steps keeps its own state."""
    torch.manual_seed(0)
    channels, width = 6, 4
    weight, x, other = torch.randn(channels, width), torch.randn(10, channels), torch.randn(10, channels)
    states = torch.zeros(3, channels, width - 1)
    whole = causal_conv1d(x, weight, torch.zeros(1, channels, width - 1), torch.tensor([0]), [10])
    chunks, other_chunks = [], []
    for span in ([0, 5], [5, 7], [7, 8], [8, 9], [9, 10]):
        n = span[1] - span[0]
        out = causal_conv1d(torch.cat([x[span[0]:span[1]], other[span[0]:span[1]]]), weight, states,
                            torch.tensor([2, 0]), [n, n])
        chunks.append(out[:n])
        other_chunks.append(out[n:])
    torch.testing.assert_close(torch.cat(chunks), whole)
    torch.testing.assert_close(torch.cat(other_chunks),
                               causal_conv1d(other, weight, torch.zeros(1, channels, width - 1), torch.tensor([0]),
                                             [10]))


def sampling_case(rows: int, vocab: int) -> tuple:
    """Logits and options for `kernels.sample`, every kind of row among them: greedy; temperature alone; top-k
    from 1 to past the vocabulary; top-p from 1e-6 to 0.999; min-p up to 1; rows with ties (logits in steps of
    0.5), masked tokens (-inf), a single finite token; and uniforms at 0 and just below 1."""
    torch.manual_seed(1)
    logits = torch.randn(rows, vocab) * (torch.rand(rows, 1) * 6 + 0.1)
    logits[1::9] = (logits[1::9] * 2).round() / 2
    logits[::7, ::3] = float("-inf")
    logits[5::41, 1:] = float("-inf")
    temperatures = torch.rand(rows) * 1.5 + 0.05
    temperatures[::11] = 0
    top_ks = torch.randint(1, 60, (rows,))
    top_ks[::2], top_ks[3::13], top_ks[4::17] = 0, vocab + 5, 1
    top_ps = torch.rand(rows) * 0.9 + 0.1
    top_ps[::3], top_ps[2::19], top_ps[6::23] = 1.0, 1e-6, 0.999
    min_ps = torch.rand(rows) * 0.3
    min_ps[::2], min_ps[8::29] = 0.0, 1.0
    uniforms = torch.rand(rows, dtype=torch.float64)
    uniforms[::31], uniforms[10::37] = 0.0, 1 - 2**-53
    return logits, temperatures, top_ks, top_ps, min_ps, uniforms


@pytest.mark.parametrize(("rows", "vocab"), [(1, 50), (300, 3000)])  # one row, and spread over threads
def test_sampling_equals_the_reference(rows, vocab):
    case = sampling_case(rows, vocab)
    assert cpu_sampling.applies(case[0])
    assert torch.equal(sample(*case), sample_reference(*case))
