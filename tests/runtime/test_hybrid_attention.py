"""The hybrid stacks (Gated DeltaNet linear attention beside gated full attention) against transformers' own
classes on tiny random checkpoints: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, and Qwen3.5 as published (beside a vision
tower). Greedy tokens and logprobs under chunked prefill, parallel samples that must each compute their own state,
preemption and abort handing every state slot and block back, TP=2 = TP=1."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

from runtime import LLM, InvalidInputError, SamplingParams
from testing.model_factory import add_vision_tower, build_model_dir, kv_cache_bytes
from tests.runtime.test_greedy_parity import WORDS, _reference

OPTIONS = {"dtype": "float32", "max_model_len": 256, "max_num_batched_tokens": 32}
FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Each family's checkpoint (four layers: linear, full, linear, full attention), built on first use."""
    built = {}

    def get(family: str):
        if family not in built:
            built[family] = build_model_dir(tmp_path_factory.mktemp(family), family, num_layers=4)
        return built[family]

    return get


@pytest.fixture(scope="module")
def qwen3_next(model_dirs):
    return model_dirs("qwen3_next")


@pytest.fixture(scope="module")
def llm(qwen3_next):
    return LLM(str(qwen3_next), **OPTIONS)


def _prompts(tokenizer, count: int = 8) -> list[list[int]]:
    """Prompts of 4 to 95 tokens, every other one opening with the same 24 words: chunks of 32 cut most of them."""
    system = " ".join(WORDS * 2)
    prompts = []
    for i in range(count):
        text = " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(4 + 9 * i))
        prompts.append(tokenizer.encode(f"{system} {text}" if i % 2 else text))
    return prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_under_chunked_prefill(model_dirs, family):
    path = model_dirs(family)
    llm = LLM(str(path), **OPTIONS)
    prompts = _prompts(llm.tokenizer)
    assert max(map(len, prompts)) > 3 * OPTIONS["max_num_batched_tokens"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    assert [o.outputs[0].token_ids for o in outputs] == _reference(path, prompts, 16)
    assert sum(o.num_cached_tokens for o in outputs) == 0  # a shared system prompt, but no prefix reuse


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_logprobs_match_transformers(model_dirs, family):
    """Every prompt position's and generated token's log-probability: the numerics greedy tokens can hide."""
    path = model_dirs(family)
    llm = LLM(str(path), **OPTIONS)
    prompts = _prompts(llm.tokenizer)[-3:]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, logprobs=0, prompt_logprobs=0))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, output in zip(prompts, outputs):
        tokens = prompt + output.outputs[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0, :-1]
        expected = logits.log_softmax(-1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
        got = [lp.logprob for lp in output.prompt_logprobs[1:] + output.outputs[0].logprobs]
        torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=1e-4)


def test_the_published_layout_serves_its_language_model(model_dirs, tmp_path):
    """Qwen3.5 as released: `Qwen3_5ForConditionalGeneration`, a vision tower beside the language model; the engine
    loads the language model alone and answers as transformers' class does on text."""
    path = add_vision_tower(model_dirs("qwen3_5"), tmp_path)
    llm = LLM(str(path), **OPTIONS)
    assert type(llm.engine.runner.model).__name__ == "Qwen3_5ForConditionalGeneration"
    prompts = _prompts(llm.tokenizer)[2:5]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    model = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    for prompt, output in zip(prompts, outputs):
        expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, pad_token_id=0)
        assert output.outputs[0].token_ids == expected[0, len(prompt):].tolist()


def test_parallel_samples_each_compute_their_own_state(llm, qwen3_next):
    """n=3 siblings share a prompt; each must run it through the linear layers itself (a sibling that started
    from the others' KV blocks would start from an empty state)."""
    prompt = _prompts(llm.tokenizer)[5]
    (output,) = llm.generate([prompt], SamplingParams(n=3, temperature=0, max_tokens=12))
    assert [c.token_ids for c in output.outputs] == _reference(qwen3_next, [prompt], 12) * 3


def test_preemption_and_abort_give_every_state_slot_and_block_back(qwen3_next):
    llm = LLM(str(qwen3_next), kv_cache_bytes=kv_cache_bytes(qwen3_next, num_blocks=20), max_num_seqs=6, **OPTIONS)
    engine = llm.engine
    prompts = _prompts(llm.tokenizer)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    assert engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == _reference(qwen3_next, prompts, 40)
    assert sorted(engine.scheduler.free_state_slots) == list(range(6))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=40))
    for _ in range(6):
        engine.step()
    assert len(engine.scheduler.free_state_slots) < 6
    for i in range(len(prompts)):
        engine.abort(str(i))
    assert sorted(engine.scheduler.free_state_slots) == list(range(6))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_speculative_decoding_is_refused_at_start(qwen3_next):
    with pytest.raises(InvalidInputError, match="speculative decoding is not supported for Qwen3NextForCausalLM"):
        LLM(str(qwen3_next), speculative_config={"method": "ngram", "num_speculative_tokens": 2}, **OPTIONS)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe",
                                    pytest.param("qwen3_5", marks=pytest.mark.reliability)])  # shards as -MoE's
def test_tp2_matches_tp1(ray_cluster, model_dirs, family):
    """Each rank holds one key head with its two value heads, and one of the two KV heads: sliced from the grouped
    projections (Qwen3-Next) or part by part (Qwen3.5)."""
    path = model_dirs(family)
    tp1 = LLM(str(path), **OPTIONS)
    prompts = _prompts(tp1.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=12)
    expected = [o.outputs[0].token_ids for o in tp1.generate(prompts, params)]
    tp2 = LLM(str(path), tensor_parallel_size=2, **OPTIONS)
    try:
        assert [o.outputs[0].token_ids for o in tp2.generate(prompts, params)] == expected
    finally:
        tp2.shutdown()
