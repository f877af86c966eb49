"""Each Triton kernel equals its torch reference: on the GPU when there is one, else in Triton's
interpreter on CPU (TRITON_INTERPRET=1, set by conftest), at small shapes."""

import pytest
import torch

from kernels import QuantizedWeight, code_table
from kernels.activation import silu_and_mul_reference
from kernels.attention.torch_backend import TorchBackend
from kernels.attention.torch_backend import paged_attention as reference_attention
from kernels.attention.torch_backend import store_kv_cache as reference_store
from kernels.gated_delta import gated_delta_rule_reference
from kernels.moe import fused_experts_reference
from kernels.norm import rms_norm_reference as reference_rms_norm
from kernels.rotary import apply_rotary_reference as reference_rotary
from kernels.sampling import sample_reference
from kernels.triton import attention as triton_attention
from kernels.triton import elementwise
from kernels.triton import gated_delta as triton_gated_delta
from kernels.triton import moe as triton_moe
from kernels.triton import quantized_matmul as triton_quantized
from kernels.triton import sampling as triton_sampling
from tests.kernels.test_cpu_kernels import gated_delta_case, sampling_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_and_without_residual(dtype):
    torch.manual_seed(0)
    x, residual = torch.randn(7, 96, dtype=dtype), torch.randn(7, 96, dtype=dtype)
    weight = torch.randn(96, dtype=dtype)
    expected = reference_rms_norm(x, weight, 1e-6)
    got = elementwise.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6).cpu()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    expected, expected_residual = reference_rms_norm(x, weight, 1e-6, residual)
    got, got_residual = elementwise.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6, residual.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(got_residual.cpu(), expected_residual, atol=tol, rtol=tol)


def test_rotary():
    torch.manual_seed(1)
    q, k = torch.randn(9, 4, 32), torch.randn(9, 2, 32)
    angles = torch.rand(9, 16) * 6
    expected = reference_rotary(q, k, angles.cos(), angles.sin())
    got = elementwise.apply_rotary(q.to(DEVICE), k.to(DEVICE), angles.cos().to(DEVICE), angles.sin().to(DEVICE))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)


def test_store_kv_cache():
    torch.manual_seed(2)
    k, v = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    slots = torch.tensor([3, 17, 4, 30, 0, 9])
    expected_k, expected_v = torch.zeros(8, 4, 2, 8), torch.zeros(8, 4, 2, 8)
    reference_store(k, v, expected_k, expected_v, slots)
    got_k, got_v = torch.zeros(8, 4, 2, 8, device=DEVICE), torch.zeros(8, 4, 2, 8, device=DEVICE)
    elementwise.store_kv_cache(k.to(DEVICE), v.to(DEVICE), got_k, got_v, slots.to(DEVICE))
    assert torch.equal(got_k.cpu(), expected_k) and torch.equal(got_v.cpu(), expected_v)


@pytest.mark.skipif(DEVICE == "cpu", reason="Triton's interpreter rounds to FP8 wrongly (1.9 to 1.0: the mantissa's "
                    "carry is lost); checked on the GPU, and the torch store on CPU by the engine's tests")
def test_store_into_an_fp8_cache_rounds_to_e4m3_and_clamps():
    torch.manual_seed(2)
    k, v = torch.randn(6, 2, 8) * 100, torch.randn(6, 2, 8)
    k[0, 0, 0] = 1000.0  # past e4m3's largest, 448
    slots = torch.tensor([3, 17, 4, 30, 0, 9])
    fp8 = torch.float8_e4m3fn
    expected_k, expected_v = torch.zeros(8, 4, 2, 8, dtype=fp8), torch.zeros(8, 4, 2, 8, dtype=fp8)
    reference_store(k, v, expected_k, expected_v, slots)
    got_k, got_v = (torch.zeros(8, 4, 2, 8, dtype=fp8, device=DEVICE) for _ in range(2))
    elementwise.store_kv_cache(k.to(DEVICE), v.to(DEVICE), got_k, got_v, slots.to(DEVICE))
    assert torch.equal(got_k.cpu().float(), expected_k.float()) and torch.equal(got_v.cpu().float(), expected_v.float())
    assert expected_k.float().view(-1, 2, 8)[3, 0, 0] == 448


def test_paged_attention_over_an_fp8_cache_reads_its_values_widened():
    torch.manual_seed(5)
    block, heads, kv_heads, dim = 4, 4, 2, 16
    cache = [torch.randn(16, block, kv_heads, dim).to(torch.float8_e4m3fn) for _ in range(2)]
    tables, contexts, queries = [[1, 2, 3], [4, 5]], [3 * block - 1, 2 * block], [1, 2 * block]
    reference_meta = TorchBackend().build_metadata(queries, contexts, tables, block, 1, torch.device("cpu"))
    q = torch.randn(sum(queries), heads, dim)
    expected = reference_attention(q, cache[0].float(), cache[1].float(), reference_meta, dim**-0.5)
    assert torch.equal(reference_attention(q, *cache, reference_meta, dim**-0.5), expected)  # the torch backend's
    backend = triton_attention.TritonBackend()
    meta = backend.build_metadata(queries, contexts, tables, block, 1, torch.device(DEVICE))
    got = backend.attend(q.to(DEVICE), cache[0].to(DEVICE), cache[1].to(DEVICE), meta, dim**-0.5)
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("window", "softcap", "sinks"), [(None, None, False), (13, None, False),
                                                       (None, 5.0, True), (20, 5.0, True)])
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block", "dtype"), [
    (4, 2, 16, 4, torch.float32),
    (14, 2, 64, 16, torch.float32),  # Qwen2.5-0.5B's seven query heads per KV head
    pytest.param(14, 2, 64, 16, torch.bfloat16, marks=pytest.mark.skipif(
        DEVICE == "cpu", reason="Triton's interpreter computes bf16 dots wrongly; checked on the GPU")),
])
def test_paged_attention_on_a_mixed_batch(heads, kv_heads, dim, block, dtype, window, softcap, sinks):
    """Decodes (some sharing prefix blocks), a fresh prefill and a chunk after a cached prefix; under a sliding
    window, with soft-capped scores and with attention sinks too."""
    torch.manual_seed(3)
    k_cache, v_cache = torch.randn(48, block, kv_heads, dim, dtype=dtype), torch.randn(48, block, kv_heads, dim,
                                                                                       dtype=dtype)
    shared = [1, 2, 3]
    seqs = [(shared + [10, 11], 4 * block + 2, 1), (shared + [12], 3 * block + 1, 1), ([20, 21], block + 2, 1),
            ([30, 31, 32, 33, 34], 4 * block + 3, 4 * block + 3), (shared + [40, 41], 4 * block + 3, block + 3)]
    tables, contexts, queries = [t for t, _, _ in seqs], [c for _, c, _ in seqs], [n for _, _, n in seqs]
    reference_meta = TorchBackend().build_metadata(queries, contexts, tables, block, 3, torch.device("cpu"))
    q = torch.randn(sum(queries), heads, dim, dtype=dtype)
    sink_logits = torch.randn(heads) * 2 if sinks else None
    expected = reference_attention(q.float(), k_cache.float(), v_cache.float(), reference_meta, dim**-0.5, window,
                                   softcap, sink_logits)
    backend = triton_attention.TritonBackend()
    meta = backend.build_metadata(queries, contexts, tables, block, 3, torch.device(DEVICE))
    assert torch.equal(meta.slot_mapping.cpu(), reference_meta.slot_mapping)
    got = backend.attend(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), meta, dim**-0.5, window=window,
                         softcap=softcap, sinks=None if sink_logits is None else sink_logits.to(DEVICE))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_experts(bias):
    """Top-2 of 5 experts for 13 tokens (one expert unused, row and column counts off the block sizes), with and
    without biases, against the torch grouped products."""
    torch.manual_seed(4)
    tokens, hidden, intermediate, experts = 13, 40, 24, 5
    x = torch.randn(tokens, hidden)
    weights, ids = torch.rand(tokens, 2), torch.randint(0, experts - 1, (tokens, 2))
    gate_up, down = torch.randn(experts, hidden, 2 * intermediate), torch.randn(experts, intermediate, hidden)
    biases = (torch.randn(experts, 2 * intermediate), torch.randn(experts, hidden)) if bias else (None, None)
    expected = fused_experts_reference(x, weights, ids, gate_up, down, silu_and_mul_reference, *biases)
    on_device = [t if t is None else t.to(DEVICE) for t in (x, weights, ids, gate_up, down, *biases)]
    got = triton_moe.fused_experts(*on_device[:5], silu_and_mul_reference, *on_device[5:])
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind,bits,group,zeros", [("int", 4, 32, True), ("int", 8, 64, False),
                                                   ("float", 8, 32, False), ("float", 4, 32, False)])
def test_quantized_matmul(kind, bits, group, zeros):
    torch.manual_seed(3)
    out, inner = 80, 96  # neither a whole number of column blocks
    codes = torch.randint(0, 256, (out, inner * bits // 8), dtype=torch.uint8)
    if kind == "float" and bits == 8:  # no NaN codes
        codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    scale = torch.rand(out, inner // group) + 0.5
    zero = torch.randint(-8, 8, (out, inner // group)).float() if zeros else None
    weight = QuantizedWeight(codes, bits, code_table(kind, bits), kind == "float", scale, zero, out, inner)
    x, bias = torch.randn(19, inner), torch.randn(out)
    expected = weight.reference_matmul(x, bias)
    on = [t.to(DEVICE) if t is not None else None for t in (x, codes, scale, zero, bias)]
    got = triton_quantized.quantized_matmul(on[0], on[1], bits, kind == "float", on[2], on[3], on[4]).cpu()
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)


def test_gated_delta_rule_over_decodes_and_prefill_chunks():
    """Value heads of 80 features: two blocks of 64, the second partly masked."""
    q, k, v, g, beta, states, slots, cu_seqlens = (t.to(DEVICE) for t in gated_delta_case(value_dim=80))
    expected_states = states.clone()
    expected = gated_delta_rule_reference(q, k, v, g, beta, expected_states, slots, cu_seqlens)
    torch.testing.assert_close(triton_gated_delta.gated_delta_rule(q, k, v, g, beta, states, slots, cu_seqlens),
                               expected)
    torch.testing.assert_close(states, expected_states)


def test_sampling_equals_the_reference():
    case = sampling_case(40, 300)
    got = triton_sampling.sample(*(t.to(DEVICE) for t in case)).cpu()
    assert torch.equal(got, sample_reference(*case))
