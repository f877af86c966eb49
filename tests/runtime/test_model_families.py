"""Every model family against transformers' own class on a tiny random config: greedy tokens under chunked
prefill, with the prefix cache on and off, bfloat16 tokens as the reference's argmax, TP=2 against TP=1, sliding
windows shorter than the prompts, and the configs the engine refuses at start."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from runtime import LLM, InvalidInputError, SamplingParams
from runtime.core.block_manager import FREED
from runtime.layers.moe import FusedExperts
from runtime.layers.rotary import RotaryTables
from runtime.models import SUPPORTED_ARCHITECTURES
from testing.bf16_reference import assert_tokens_are_bf16_argmax
from testing.model_factory import add_vision_tower, build_model_dir
from tests.runtime.test_greedy_parity import WORDS, _reference

# each family's tiny shape beyond build_model_dir's defaults (MoE families: 4 experts, top-2); "arch" when the
# name is not the architecture's
FAMILIES = {
    "mistral": {},
    "phi3": {},
    "mixtral": {},
    "qwen2_moe": {"num_layers": 3, "mlp_only_layers": [1]},  # a dense layer between two sparse ones
    "qwen3_moe": {"head_dim": 32},
}
# Gemma: tied embeddings, a 16-token window on alternate layers (Gemma 3: its own RoPE base there), a query
# scale off head_dim, caps low enough to bite (transformers' Gemma 3 applies no attention cap)
GEMMA = {"tie_word_embeddings": True, "sliding_window": 16, "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0}
FAMILIES |= {
    "gemma2": {**GEMMA, "attn_logit_softcapping": 2.0},
    "gemma3": {**GEMMA, "layer_types": ["sliding_attention", "full_attention"]},
    "gpt_oss": {"sliding_window": 16},  # sinks, YaRN, biased experts on every layer; alternate layers slide
    # multipliers far enough from 1 to show; NoPE on layers 2 and 4 of 4
    "granite": {"embedding_multiplier": 6.0, "attention_multiplier": 0.1, "residual_multiplier": 0.5,
                "logits_scaling": 4.0},
    "smollm3": {"num_layers": 4, "no_rope_layer_interval": 2},
    "olmo2": {},  # norms after attention and MLP; q/k norms over every head
    "olmo3": {"num_layers": 4, "sliding_window": 16},  # OLMo 2's layers, three of four sliding
    "deepseek_v3": {},  # latent attention, grouped sigmoid routing with a correction bias, a dense first layer
    "deepseek_v2": {},  # latent attention without a q latent, group-limited softmax routing
    "glm4_moe": {},  # that routing under grouped-query attention with half of each head rotated
    # sigmoid routing without groups, q/k norms across heads, half of each head rotated; experts of 32 features
    "minimax_m2": {"intermediate_size": 32},
    "ernie4_5": {},  # biases on every projection, rotary over interleaved pairs
    "seed_oss": {},  # biases on q/k/v and on o_proj
    # post-norm layers, per-head q/k norms; layers 1-3 of 4 slide and rotate, layer 4 attends fully without RoPE
    "exaone4": {"num_layers": 4, "sliding_window": 16, "sliding_window_pattern": 4},
    "ernie4_5_moe": {"num_layers": 3},  # softmax routing with a selection bias, a dense first layer
    # chunks of 32 positions on layers 1-3, layer 4 global without RoPE with scaled queries; input-scaled experts
    "llama4": {"num_layers": 4},
}
# a 16-token window: every layer (Mistral), or layer 1 of 2 (Qwen2 slides from layer `max_window_layers` on)
SLIDING = {
    "mistral_sliding": {"arch": "mistral", "sliding_window": 16},
    "qwen2_sliding": {"arch": "qwen2", "sliding_window": 16, "use_sliding_window": True, "max_window_layers": 1},
}
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Builds each family's checkpoint once, on first use."""
    built = {}

    def get(family: str):
        if family not in built:
            fields = dict({**FAMILIES, **SLIDING}[family])
            built[family] = build_model_dir(tmp_path_factory.mktemp(family), fields.pop("arch", family), **fields)
        return built[family]

    return get


def _prompts(tokenizer) -> list[list[int]]:
    """16 prompts of 3 to 33 words; every other one opens with the same system text (two cache blocks)."""
    system = tokenizer.encode(" ".join(WORDS * 2))
    prompts = []
    for i in range(16):
        words = tokenizer.encode(" " + " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(3 + 2 * i)))
        prompts.append(system + words if i % 2 else words)
    return prompts


def _tokens(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers_with_chunked_prefill_and_prefix_cache(model_dirs, family):
    path = model_dirs(family)
    options = {"dtype": "float32", "max_model_len": 256, "max_num_batched_tokens": 32}
    cached = LLM(str(path), **options)
    prompts = _prompts(cached.tokenizer)
    outputs = cached.generate(prompts, GREEDY)
    assert sum(o.num_cached_tokens for o in outputs) > 0
    expected = _reference(path, prompts, GREEDY.max_tokens)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert _tokens(LLM(str(path), enable_prefix_caching=False, **options), prompts) == expected


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma3", "mistral_sliding"])
def test_bf16_greedy_tokens_are_the_references_argmax(model_dirs, family):
    """An MoE, alternate sliding and full layers, and a sliding window, in bfloat16 (decode steps
    replaying CUDA graphs on a GPU): every token is transformers' bf16 argmax, up to rounding."""
    path = model_dirs(family)
    llm = LLM(str(path), dtype="bfloat16", max_model_len=256)
    prompts = _prompts(llm.tokenizer)[:10]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert (llm.engine.runner.graphs is not None) == (device == "cuda")
    assert_tokens_are_bf16_argmax(path, prompts, _tokens(llm, prompts), device)


@pytest.mark.parametrize("family", SLIDING)
def test_sliding_window_matches_transformers(model_dirs, family):
    """Prompts of 53 to 84 tokens, 30 generated, through a 16-token window: prefilled in chunks of 32, after
    cached prefixes or not. Where every layer slides, blocks before the window are freed as sequences grow."""
    path = model_dirs(family)
    params = SamplingParams(temperature=0, max_tokens=30)
    options = {"dtype": "float32", "max_model_len": 256, "max_num_batched_tokens": 32}
    llm = LLM(str(path), **options)
    prompts = [p for p in _prompts(llm.tokenizer) if len(p) > 40][:6]
    expected = _reference(path, prompts, params.max_tokens)
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs, freed = {}, 0
    while engine.has_unfinished_requests():
        for delta in engine.step():
            outputs.setdefault(delta.request_id, []).extend(t for s in delta.seqs for t in s.token_ids)
        freed = max(freed, sum(b == FREED for s in engine.scheduler.running for b in s.block_table))
    assert [outputs[str(i)] for i in range(len(prompts))] == expected
    assert (freed > 0) == (family == "mistral_sliding")  # a full layer keeps every block
    assert engine.block_manager.hit_tokens > 0
    for backend in ("torch", "triton") if torch.cuda.is_available() else ("torch", "cpu"):
        uncached = LLM(str(path), enable_prefix_caching=False, attention_backend=backend, **options)
        assert [o.outputs[0].token_ids for o in uncached.generate(prompts, params)] == expected


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "gpt_oss", "mistral_sliding", "granite", "smollm3", "olmo2",
                                    "olmo3", "exaone4", "deepseek_v2", "deepseek_v3", "glm4_moe", "minimax_m2",
                                    "ernie4_5_moe", "llama4"])
def test_logprobs_match_transformers(model_dirs, family):
    """Every prompt position's and every generated token's log-probability (chunked prefill, then decode) equal
    transformers' over the whole sequence: numerics that greedy tokens of a tiny model can hide (a soft cap or a
    RoPE base off leaves these models' argmax alone)."""
    path = model_dirs(family)
    llm = LLM(str(path), dtype="float32", max_model_len=256, max_num_batched_tokens=32)
    prompts = [p for p in _prompts(llm.tokenizer) if len(p) > 40][:4]
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=0, prompt_logprobs=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, output in zip(prompts, llm.generate(prompts, params)):
        completion = output.outputs[0]
        tokens = prompt + completion.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0, :-1]
        expected = logits.float().log_softmax(-1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
        got = [lp.logprob for lp in output.prompt_logprobs[1:] + completion.logprobs]
        torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen2_moe", "phi3", "mistral_sliding", "gemma2", "gemma3", "gpt_oss", "olmo2",
                                    "deepseek_v3", "minimax_m2", "ernie4_5_moe", "llama4",
                                    *(pytest.param(f, marks=pytest.mark.reliability)
                                      for f in ("granite", "smollm3", "glm4_moe", "deepseek_v2", "exaone4"))])
# experts and a shared expert; fused q/k/v and gate/up; a window; Gemma's layers; sinks and biased experts; q/k
# norms across the ranks; latent attention (its latent replicated, heads split) and grouped sigmoid routing;
# sigmoid routing beside partial rotary; softmax routing with interleaved rotary; chunked layers and input-scaled
# experts. Granite, SmolLM3, GLM-4.5, DeepSeek-V2 and EXAONE 4 shard nothing these do not: they run in the
# reliability run (.ci/run), out of the default suite for its time.
def test_tp2_matches_tp1(ray_cluster, model_dirs, family):
    path = model_dirs(family)
    tp1 = LLM(str(path), max_model_len=256)
    prompts = _prompts(tp1.tokenizer)
    expected = _tokens(tp1, prompts)  # before TP=2 joins this process to its group
    llm = LLM(str(path), max_model_len=256, tensor_parallel_size=2)
    try:
        assert _tokens(llm, prompts) == expected
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss",
                                    *(pytest.param(f, marks=pytest.mark.reliability)
                                      for f in ("deepseek_v3", "llama4", "minimax_m2", "ernie4_5_moe"))])
# a shared expert and a dense layer; biased experts loaded from fused tensors; grouped sigmoid routing; experts
# called one top-k slot at a time; sigmoid routing; a selection bias. The last four run in the reliability run.
def test_expert_parallel_matches_expert_sharding(ray_cluster, model_dirs, family):
    """Each rank holds half the experts whole and runs its own experts' (token, expert) pairs: the same greedy
    tokens as TP=1 (itself equal to TP=2 with sharded experts), with chunked prefill and prefix hits."""
    path = model_dirs(family)
    options = {"max_model_len": 256, "max_num_batched_tokens": 32}
    tp1 = LLM(str(path), **options)
    prompts = _prompts(tp1.tokenizer)
    expected = _tokens(tp1, prompts)
    llm = LLM(str(path), **options, tensor_parallel_size=2, enable_expert_parallel=True)
    try:
        outputs = llm.generate(prompts, GREEDY)
        assert [o.outputs[0].token_ids for o in outputs] == expected
        assert sum(o.num_cached_tokens for o in outputs) > 0
        experts = [m for m in llm.engine.runner.model.modules() if isinstance(m, FusedExperts)]
        assert experts and all(m.local == m.num_experts // 2 and m.first == 0 for m in experts)  # rank 0's half
    finally:
        llm.shutdown()


def test_chunked_attention_on_every_backend_and_as_published(model_dirs, tmp_path):
    """Llama 4's chunked layers (32 positions) over prompts of up to four chunks and 30 tokens more, prefilled in
    pieces of 32 that straddle chunk starts, on each attention backend; and the checkpoint as Meta publishes it
    (`Llama4ForConditionalGeneration`, a vision tower beside the language model), served as its language model."""
    path = model_dirs("llama4")
    params = SamplingParams(temperature=0, max_tokens=30)
    options = {"dtype": "float32", "max_model_len": 256, "max_num_batched_tokens": 48}
    prompts = [p for p in _prompts(LLM(str(path), **options).tokenizer) if len(p) > 40][:6]
    expected = _reference(path, prompts, params.max_tokens)
    for backend in ("torch", "triton") if torch.cuda.is_available() else ("torch", "cpu"):
        llm = LLM(str(path), attention_backend=backend, **options)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    published = LLM(str(add_vision_tower(path, tmp_path)), **options)
    assert type(published.engine.runner.model).__name__ == "Llama4ForConditionalGeneration"
    assert [o.outputs[0].token_ids for o in published.generate(prompts, params)] == expected


def test_fused_expert_tensors_load(model_dirs, tmp_path):
    """A checkpoint holding each layer's experts as fused [E, ...] tensors (transformers' in-memory layout)."""
    source = model_dirs("mixtral")
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    state = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file({name: t.contiguous() for name, t in state.items()}, tmp_path / "model.safetensors")
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=256)
    prompts = _prompts(llm.tokenizer)[:4]
    assert _tokens(llm, prompts) == _reference(source, prompts, GREEDY.max_tokens)


def test_latent_attention_caches_the_latent_not_per_head_keys_and_values(model_dirs, tmp_path):
    """A DeepSeek-V3 token costs each layer its latent and rotary key part, once (keys and values are one
    plane), not heads x (key + value); the checkpoint's multi-token-prediction layer is passed over."""
    source = model_dirs("deepseek_v3")
    config = AutoConfig.from_pretrained(source)
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    state = load_file(source / "model.safetensors")
    layers = config.num_hidden_layers  # DeepSeek saves its prediction layer after the last decoder layer
    state |= {name.replace(f"layers.{layers - 1}.", f"layers.{layers}."): t.clone() for name, t in state.items()
              if f"layers.{layers - 1}." in name}
    save_file(state, tmp_path / "model.safetensors")
    per_head = layers * config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim
                                                       + config.v_head_dim) * 4
    # the C++ and Triton kernels run it as one KV head of 64 (latent 56 + rotary 8)
    for backend in ("torch", "triton") if torch.cuda.is_available() else ("torch", "cpu"):
        llm = LLM(str(tmp_path), dtype="float32", max_model_len=256, attention_backend=backend)
        per_token = llm.engine.runner.kv_bytes_per_token
        assert per_token == layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 4
        assert 2 * per_token < per_head
        prompts = _prompts(llm.tokenizer)[:4]
        assert _tokens(llm, prompts) == _reference(source, prompts, GREEDY.max_tokens)


def _edited(source, target, **fields):
    """A copy of the checkpoint at `source` whose config.json has `fields` replaced."""
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **fields}))
    return str(target)


def test_unknown_architecture_is_refused_naming_it_and_the_supported_ones(model_dirs, tmp_path):
    path = _edited(model_dirs("mistral"), tmp_path, architectures=["GemmaForCausalLM"])
    with pytest.raises(InvalidInputError) as e:
        LLM(path)
    assert e.value.param == "model" and "GemmaForCausalLM" in str(e.value)
    assert all(name in str(e.value) for name in SUPPORTED_ARCHITECTURES)
    assert {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Phi3ForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)


def test_longrope_past_its_original_context_matches_transformers_and_partial_rotary_runs(model_dirs, tmp_path):
    """A longrope model (original context 128) run to 256, as transformers' Phi-3 generates: prompts of 91 and 94
    tokens generating past 128 (rotated by the short factors, then recomputed with the long ones as they pass it)
    beside prompts of 130 and 138 (long throughout), all opening with the same text, under chunked prefill and the
    prefix cache (a long sequence never reuses a short one's blocks)."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
            "original_max_position_embeddings": 128}
    path = _edited(model_dirs("phi3"), tmp_path / "longrope", rope_parameters=rope,
                   original_max_position_embeddings=128)
    llm = LLM(path, dtype="float32", max_model_len=256, max_num_batched_tokens=64)
    system = llm.tokenizer.encode(" ".join(WORDS * 3))
    prompts = [system + llm.tokenizer.encode(" ".join(WORDS[i:] * (1 + 2 * (i % 2)))) for i in range(4)]
    assert sorted(len(p) > 128 for p in prompts) == [False, False, True, True]
    params = SamplingParams(temperature=0, max_tokens=48)
    outputs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == _reference(path, prompts, params.max_tokens)
    assert llm.stats()["num_preemptions"] == 2  # each short sequence, once, as it passed 128
    with torch.device("meta"):  # a model is built under its device: the tables too, whatever the rope type
        tables = RotaryTables(AutoConfig.from_pretrained(path), 16, 256)
    assert tables.cos.is_meta and tables.cos.shape[0] == 512  # short rows, then long ones
    partial = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}  # as Phi-4-mini
    path = _edited(model_dirs("phi3"), tmp_path / "partial", rope_parameters=partial)
    llm = LLM(path, dtype="float32", max_model_len=256)
    prompts = _prompts(llm.tokenizer)[:4]
    assert _tokens(llm, prompts) == _reference(path, prompts, GREEDY.max_tokens)


def test_dynamic_ntk_past_its_original_context_matches_transformers(tmp_path):
    """Dynamic NTK (original context 128, factor 2) run to 256, as transformers generates: prompts of 91 and 94
    tokens generating past 128 (each new token by the base of the length it makes) beside prompts of 130 and 138
    (rotated by the base of their own length, then by their growing length), under chunked prefill and the prefix
    cache. transformers keeps the last base it computed across calls, so each prompt gets a fresh model."""
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    path = build_model_dir(tmp_path, "llama", max_positions=128, rope_parameters=rope)
    llm = LLM(str(path), dtype="float32", max_model_len=256, max_num_batched_tokens=64)
    system = llm.tokenizer.encode(" ".join(WORDS * 3))
    prompts = [system + llm.tokenizer.encode(" ".join(WORDS[i:] * (1 + 2 * (i % 2)))) for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=48)
    outputs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == [_reference(path, [p], params.max_tokens)[0] for p in prompts]
    with pytest.raises(InvalidInputError, match="257 exceeds the model's context"):
        LLM(str(path), max_model_len=257)


def test_lora_on_a_mixture_of_experts_is_refused(model_dirs):
    with pytest.raises(InvalidInputError) as e:
        LLM(str(model_dirs("qwen3_moe")), enable_lora=True)
    assert e.value.param == "enable_lora" and "Qwen3MoeForCausalLM" in str(e.value)
