"""Quantized checkpoints as llm-compressor writes them (compressed-tensors): INT4/INT8 weights with group or
channel scales (symmetric or with zero points), W8A8 INT8, FP8 per channel and in 128x128 blocks; and gpt-oss with
MXFP4 experts as OpenAI publishes it. The oracle is transformers' quantization integrations, with
compressed-tensors' own input quantization (testing.quantized_checkpoints); the weights stay quantized in our
engine's memory."""

import json
from functools import partial

import pytest
import torch

from runtime import LLM, InvalidInputError, LoRARequest, SamplingParams
from runtime.layers.quantization.experts import QuantizedExperts
from runtime.layers.quantization.mxfp4 import Mxfp4Experts
from testing.lora_adapters import ALL, adapt
from testing.model_factory import build_model_dir
from testing.quantized_checkpoints import (
    QUANTIZES_ACTIVATIONS,
    SCHEMES,
    dequantized_reference_model,
    fine_grained_fp8_reference_model,
    fp8_kv_reference_model,
    mxfp4_reference_model,
    reference_model,
    write_fine_grained_fp8,
    write_mxfp4_gpt_oss,
    write_quantized,
)
from tests.conftest import MODEL_ID, another_app, app_args
from tests.runtime.test_greedy_parity import WORDS

MAX_TOKENS = 16
# a 256-wide model, so that 128-input groups and 128x128 blocks split across two ranks
SHAPE = {"arch": "qwen3", "hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_kv_heads": 2,
         "head_dim": 64}
# resident bytes of the quantized projections against the same matrices in bfloat16
LARGEST_SHARE_OF_BF16 = {"W4A16": 0.35, "W4A16_ASYM": 0.35, "W8A16": 0.6, "W8A8": 0.6, "FP8": 0.6, "FP8_DYNAMIC": 0.6,
                         "FP8_BLOCK": 0.6}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """One unquantized model, and its copy in a scheme: compressed-tensors' presets (SCHEMES), or DeepSeek's FP8
    layout as transformers writes it (FINE_GRAINED_FP8)."""
    base = build_model_dir(tmp_path_factory.mktemp("base"), **SHAPE)
    writers = {scheme: partial(write_quantized, scheme=scheme) for scheme in SCHEMES}
    writers["FINE_GRAINED_FP8"] = write_fine_grained_fp8
    paths = {}

    def path(scheme: str):
        if scheme not in paths:
            paths[scheme] = writers[scheme](base, tmp_path_factory.mktemp(scheme.lower()))
        return paths[scheme]

    return path


def quantized_prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + 3 * i))) for i in range(16)]


def reference_tokens(reference, prompts) -> list[list[int]]:
    return [reference.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_TOKENS,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]


def assert_reference_tokens(reference, prompts, ours) -> None:
    """Our greedy tokens are the reference's, up to where it stops at EOS (ours ignore it), and that is most."""
    expected = reference_tokens(reference, prompts)
    assert [tokens[:len(e)] for tokens, e in zip(ours, expected)] == expected
    assert sum(map(len, expected)) > 8 * MAX_TOKENS


def greedy_tokens(llm: LLM, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_tokens_match_transformers_on_the_same_checkpoint(quantized, scheme):
    path = quantized(scheme)
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = reference_model(path)
    if scheme in QUANTIZES_ACTIVATIONS:
        _assert_near_reference_argmax(reference, prompts, ours)
    else:
        assert_reference_tokens(reference, prompts, ours)


def _assert_near_reference_argmax(reference, prompts, outputs) -> None:
    """An input rounded to the 8-bit grid turns float noise (another summation order) into a step of the grid,
    FP8's an eighth of the value: fed our tokens, each must be the reference's argmax up to a small share of the
    logit, a margin that still excludes almost every token. Each projection's exact match is the next test's."""
    for prompt, tokens in zip(prompts, outputs):
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
        best = logits.max(dim=-1).values
        tolerance = 0.05 * best.abs()
        assert (best - logits[torch.arange(MAX_TOKENS), torch.tensor(tokens)] <= tolerance).all()
        assert (logits >= (best - tolerance)[:, None]).sum(dim=-1).float().mean() < 3


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_projection_equals_the_reference_module(quantized, scheme):
    path = quantized(scheme)
    ours = LLM(str(path), dtype="float32", max_model_len=256).engine.runner.model.model.layers
    reference = reference_model(path).model.layers
    q, kv = 4 * 64, 2 * 64
    torch.manual_seed(0)
    for layer, theirs in zip(ours, reference):
        attention, mlp = layer.self_attn, layer.mlp
        for projection, columns, module in [
            (attention.qkv_proj, slice(0, q), theirs.self_attn.q_proj),
            (attention.qkv_proj, slice(q, q + kv), theirs.self_attn.k_proj),
            (attention.qkv_proj, slice(q + kv, None), theirs.self_attn.v_proj),
            (attention.o_proj, slice(None), theirs.self_attn.o_proj),
            (mlp.gate_up_proj, slice(0, 512), theirs.mlp.gate_proj),
            (mlp.gate_up_proj, slice(512, None), theirs.mlp.up_proj),
            (mlp.down_proj, slice(None), theirs.mlp.down_proj)]:
            x = torch.randn(7, module.in_features)
            with torch.no_grad():
                expected = module(x.unsqueeze(0))[0]  # a batch of one: per-token scales are over the last dimension
                ours = projection.project(x.to(projection.quantized.codes.device))[:, columns].cpu()
                torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


def test_lora_adapters_on_a_quantized_base(quantized, tmp_path):
    """An adapter made with PEFT over transformers' model of the INT4 checkpoint: its tokens, and the base's
    beside it in one batch."""
    path = quantized("W4A16")
    peft_model = adapt(reference_model(path), tmp_path, 8, 16, ALL, False, seed=0)
    llm = LLM(str(path), dtype="float32", max_model_len=256, enable_lora=True)
    prompts = quantized_prompts(llm.tokenizer)[:6]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    adapter = LoRARequest("int4-base", str(tmp_path))
    outputs = llm.generate(prompts * 2, params, lora_request=[adapter] * len(prompts) + [None] * len(prompts))
    expected = reference_tokens(peft_model, prompts)
    with peft_model.disable_adapter():
        expected += reference_tokens(peft_model, prompts)
    ours = [o.outputs[0].token_ids for o in outputs]
    assert [tokens[:len(e)] for tokens, e in zip(ours, expected)] == expected
    assert ours[: len(prompts)] != ours[len(prompts):]  # the adapter changes the tokens


@pytest.mark.parametrize("scheme", SCHEMES)
def test_weights_stay_quantized_in_memory(quantized, scheme):
    llm = LLM(str(quantized(scheme)), dtype="float32", max_model_len=256)
    model = llm.engine.runner.model
    projections = [m for m in model.modules() if getattr(m, "quantized", None) is not None]
    assert len(projections) == 2 * 4  # q/k/v, o, gate/up and down in each of the two layers
    assert all(m.weight is None and m.packed is None for m in projections)
    resident = sum(m.quantized.nbytes() for m in projections)
    bf16 = sum(2 * m.quantized.out_features * m.quantized.in_features for m in projections)
    assert resident / bf16 < LARGEST_SHARE_OF_BF16[scheme]
    if not torch.cuda.is_available():
        assert all(m.quantized.packed for m in projections)  # the C++ kernel's tiles


@pytest.mark.parametrize("scheme", ["W4A16_ASYM", "W8A8", "FINE_GRAINED_FP8"])
# groups and zero points split by input on the row-parallel projections, block scales by row and input; a
# row-parallel projection's per-token input scale over the whole row, not the rank's slice
def test_tp2_matches_tp1(ray_cluster, quantized, scheme):
    path = quantized(scheme)
    tp1 = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(tp1.tokenizer)[:8]
    expected = greedy_tokens(tp1, prompts)  # before TP=2 joins this process to its group
    llm = LLM(str(path), dtype="float32", max_model_len=256, tensor_parallel_size=2)
    try:
        ours = greedy_tokens(llm, prompts)
    finally:
        llm.shutdown()
    if scheme in QUANTIZES_ACTIVATIONS:  # the 8-bit grid makes both runs' float noise visible: each is checked
        _assert_near_reference_argmax(reference_model(path), prompts, ours)
    else:
        assert ours == expected


def test_deepseeks_fp8_layout_as_transformers_writes_it(quantized):
    """`quant_method: fp8`: e4m3 weights with a `weight_scale_inv` per 128x128 block (DeepSeek-V3's and the
    published *-FP8 checkpoints' layout), against transformers' dequantizing path."""
    path = quantized("FINE_GRAINED_FP8")
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = fine_grained_fp8_reference_model(path)
    assert_reference_tokens(reference, prompts, ours)
    projections = [m for m in llm.engine.runner.model.modules() if getattr(m, "quantized", None) is not None]
    assert len(projections) == 2 * 4 and llm.engine.spec.quantization.label == "fp8 (fp8 block)"
    resident = sum(m.quantized.nbytes() for m in projections)
    assert resident / sum(2 * m.quantized.out_features * m.quantized.in_features for m in projections) < 0.6


@pytest.fixture(scope="module")
def moe_base(tmp_path_factory):
    """A tiny Qwen3-MoE whose experts' 256 features split into whole groups of 128 on two ranks."""
    return build_model_dir(tmp_path_factory.mktemp("moe"), **{**SHAPE, "arch": "qwen3_moe"}, moe_intermediate_size=256)


@pytest.mark.parametrize("scheme", ["W4A16_ASYM", "W8A16"])
def test_quantized_moe_experts_match_the_dequantized_checkpoint(ray_cluster, moe_base, scheme, tmp_path_factory):
    """Every expert quantized too (as compressed-tensors quantizes a Linear), the experts staying quantized; the
    oracle is transformers on the checkpoint dequantized by compressed-tensors' own converter."""
    path = write_quantized(moe_base, tmp_path_factory.mktemp(f"moe-{scheme.lower()}"), scheme)
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = dequantized_reference_model(path, tmp_path_factory.mktemp("dequantized"))
    assert_reference_tokens(reference, prompts, ours)
    experts = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantizedExperts)]
    assert len(experts) == 2 and not hasattr(experts[0], "gate_up_proj_weight_scale")
    weights = [w for m in experts for w in m.gate_up + m.down]
    share = sum(w.nbytes() for w in weights) / sum(2 * w.out_features * w.in_features for w in weights)
    assert share < LARGEST_SHARE_OF_BF16[scheme]
    if scheme == "W4A16_ASYM":  # each rank's gate and up rows, and its groups of down's inputs and zero points
        tp2 = LLM(str(path), dtype="float32", max_model_len=256, tensor_parallel_size=2)
        try:
            assert greedy_tokens(tp2, prompts[:8]) == ours[:8]
        finally:
            tp2.shutdown()


def test_deepseek_v3_quantized_throughout(tmp_path_factory):
    """Latent attention's projections, the shared and routed experts and the dense first layer INT8; the latent
    `kv_b_proj`, which attention reads per head, dequantized once as it loads."""
    base = build_model_dir(tmp_path_factory.mktemp("deepseek"), arch="deepseek_v3", hidden_size=256,
                           intermediate_size=512, num_heads=4, num_kv_heads=4, moe_intermediate_size=256,
                           kv_lora_rank=128, q_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64,
                           v_head_dim=64, head_dim=32)
    path = write_quantized(base, tmp_path_factory.mktemp("deepseek-w8a16"), "W8A16")
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = dequantized_reference_model(path, tmp_path_factory.mktemp("deepseek-dequantized"))
    assert_reference_tokens(reference, prompts, ours)
    model = llm.engine.runner.model
    assert sum(isinstance(m, QuantizedExperts) for m in model.modules()) == 1  # layer 2's; layer 1 is dense
    assert sum(getattr(m, "quantized", None) is not None for m in model.modules()) == 2 * 4 + 2 + 2


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory):
    """A tiny gpt-oss and its copy with MXFP4 experts (OpenAI's layout)."""
    base = build_model_dir(tmp_path_factory.mktemp("gpt-oss"), arch="gpt_oss", hidden_size=64, intermediate_size=128,
                           sliding_window=16)
    return base, write_mxfp4_gpt_oss(base, tmp_path_factory.mktemp("gpt-oss-mxfp4"))


def test_gpt_oss_mxfp4_experts_match_transformers_and_stay_mxfp4(gpt_oss_mxfp4):
    base, path = gpt_oss_mxfp4
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = mxfp4_reference_model(path)
    assert_reference_tokens(reference, prompts, ours)
    assert greedy_tokens(LLM(str(base), dtype="float32", max_model_len=256), prompts) != ours  # FP4 changes the tokens
    experts = [m for m in llm.engine.runner.model.modules() if isinstance(m, Mxfp4Experts)]
    assert len(experts) == 2 and not hasattr(experts[0], "gate_up_proj_blocks")
    weights = [w for m in experts for w in m.gate_up + m.down]
    resident = sum(w.nbytes() for w in weights)
    assert resident / sum(2 * w.out_features * w.in_features for w in weights) < 0.35  # against bfloat16
    assert llm.engine.spec.quantization.label == "mxfp4 (experts)"


def test_gpt_oss_mxfp4_tp2_matches_tp1(ray_cluster, gpt_oss_mxfp4):
    """Each rank's gate and up rows and its blocks of down's inputs."""
    _, path = gpt_oss_mxfp4
    tp1 = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(tp1.tokenizer)[:8]
    expected = greedy_tokens(tp1, prompts)  # before TP=2 joins this process to its group
    llm = LLM(str(path), dtype="float32", max_model_len=256, tensor_parallel_size=2)
    try:
        assert greedy_tokens(llm, prompts) == expected
    finally:
        llm.shutdown()


def test_an_fp8_kv_cache_holds_four_times_float32s_blocks_and_matches_attention_over_fp8_kv(tmp_path_factory):
    base = build_model_dir(tmp_path_factory.mktemp("fp8-kv"), **SHAPE)
    options = dict(dtype="float32", max_model_len=256, kv_cache_bytes=8 << 20)
    llm = LLM(str(base), kv_cache_dtype="fp8", **options)
    runner = llm.engine.runner
    assert runner.kv_cache.dtype == torch.float8_e4m3fn
    assert runner.attention_backend.name == ("triton" if torch.cuda.is_available() else "torch")
    assert runner.num_blocks == 4 * LLM(str(base), **options).engine.runner.num_blocks  # 1 byte a value, not 4
    prompts = quantized_prompts(llm.tokenizer)
    ours = greedy_tokens(llm, prompts)
    reference = fp8_kv_reference_model(base)
    assert_reference_tokens(reference, prompts, ours)
    assert greedy_tokens(LLM(str(base), kv_cache_dtype="fp8", enable_prefix_caching=False, **options), prompts) == ours
    with pytest.raises(InvalidInputError, match="an FP8 cache needs torch or triton"):
        LLM(str(base), kv_cache_dtype="fp8", attention_backend="cpu", **options)


def test_unsupported_quantization_fails_at_start_naming_it(quantized, tmp_path):
    path = quantized("W4A16")
    with pytest.raises(InvalidInputError, match="'fp8' was asked for, but the checkpoint is compressed-tensors"):
        LLM(str(path), quantization="fp8")
    for file in path.iterdir():
        (tmp_path / file.name).symlink_to(file)
    (tmp_path / "config.json").unlink()
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="quantization method 'bitsandbytes' is not supported"):
        LLM(str(tmp_path))
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="mxfp4 checkpoints are supported for gpt-oss only"):
        LLM(str(tmp_path))
    config["quantization_config"] = json.loads((path / "config.json").read_text())["quantization_config"]
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="3-bit int weights by group is not supported"):
        LLM(str(tmp_path))


def test_served_through_the_openai_sdk(server, quantized, tmp_path_factory):
    """`serve run`'s app on a quantized checkpoint: /v1/models names the scheme, and a completion's tokens are
    the offline engine's."""
    import openai

    path = quantized("W4A16")
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompt = quantized_prompts(llm.tokenizer)[5]
    expected = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    args = app_args(path, f"file://{tmp_path_factory.mktemp('quantized-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {"max_model_len": 256, "kv_cache_bytes": 16 << 20, "warm_up": False}
    with another_app(server, "quantized", args) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        [card] = client.models.list().data
        assert card.quantization == "compressed-tensors (w4a16)"
        reply = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert reply.choices[0].text == expected.outputs[0].text
    assert reply.usage.completion_tokens == MAX_TOKENS
