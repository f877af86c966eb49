"""Async scheduling (each step launched before the previous one's tokens reach the host) changes no token:
greedy and seeded sampling, logprobs, stops, min_tokens, chunked prefill, prefix caching, preemption and
aborts give what the engine gives without it, and every block comes back."""

import asyncio
import json
import random
from contextlib import aclosing

import pytest

from runtime import LLM, AsyncLLMEngine, SamplingParams
from runtime.engine.llm_engine import LLMEngine
from runtime.errors import InvalidInputError
from runtime.text.grammar import Constraint
from testing.helpers import wait_until
from testing.model_factory import build_model_dir, kv_cache_bytes

OPTIONS = dict(dtype="float32", max_model_len=256, max_num_batched_tokens=48, max_num_seqs=12)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("async_model"), "qwen2")


@pytest.fixture(scope="module")
def engines(model):
    """(without, with) async scheduling, otherwise alike."""
    return LLM(str(model), **OPTIONS), LLM(str(model), async_scheduling=True, **OPTIONS)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(40)]  # a prefix-cache hit for half of them
    out = []
    for i in range(count):
        own = [rng.randrange(3, 500) for _ in range(5 + 13 * (i % 6))]  # some prefilled over several steps
        out.append(shared + own if i % 2 else own)
    return out


def outputs(llm: LLM, prompt_ids, params) -> list[list[tuple]]:
    return [[(c.token_ids, c.text, c.finish_reason, c.matched_stop) for c in o.outputs]
            for o in llm.generate(prompt_ids, params)]


def assert_all_blocks_free(llm: LLM) -> None:
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
    assert stats["num_requests"] == 0


def test_greedy_tokens_text_and_finish_reasons_equal_without_it(engines):
    plain, overlapped = engines
    ids = prompts(16)
    params = [SamplingParams(temperature=0, max_tokens=6 + 5 * (i % 5), ignore_eos=i % 3 == 0, n=1 + (i % 4 == 1))
              for i in range(16)]
    want = outputs(plain, ids, params)
    assert outputs(overlapped, ids, params) == want
    assert {r for o in want for (_, _, r, _) in o} >= {"length"}
    assert_all_blocks_free(overlapped)


def test_a_sequence_that_fills_the_context_takes_no_step_past_it(engines, monkeypatch):
    plain, overlapped = engines
    runner, positions = overlapped.engine.runner, []
    prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare", lambda *a: positions.extend((r := prepare(*a))[0].positions) or r)
    room = [5, 6, 7]
    ids = [[3 + (j * 7 + i) % 400 for j in range(OPTIONS["max_model_len"] - r)] for i, r in enumerate(room)]
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    want = outputs(plain, ids, params)
    assert [len(o[0][0]) for o in want] == room
    assert outputs(overlapped, ids, params) == want
    assert max(positions) == OPTIONS["max_model_len"] - 2  # the last token sampled is never an input
    assert_all_blocks_free(overlapped)


def test_stops_end_a_sequence_on_the_step_they_should(engines):
    plain, overlapped = engines
    ids = prompts(8, seed=1)
    free_run = plain.generate(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    params = []
    for i, run in enumerate(free_run):  # stop on the 3rd or 4th token: by id, by its text, or past min_tokens
        tokens = run.outputs[0].token_ids
        if i % 4 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[tokens[3]]))
        elif i % 4 == 1:
            params.append(SamplingParams(temperature=0, max_tokens=12, stop=[plain.tokenizer.decode(tokens[3:5])]))
        else:  # min_tokens 2 lets the 3rd token stop it; 3 bans it there
            params.append(SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[tokens[2]], min_tokens=i % 4))
    want = outputs(plain, ids, params)
    assert outputs(overlapped, ids, params) == want
    assert sum(r == "stop" for o in want for (_, _, r, _) in o) >= 6
    assert_all_blocks_free(overlapped)


def test_seeded_sampling_and_logprobs_equal_without_it(engines):
    plain, overlapped = engines
    ids = prompts(8, seed=2)
    params = [SamplingParams(temperature=0.3 + 0.1 * i, seed=i, top_p=0.9, top_k=20 if i % 2 else -1,
                             min_p=0.02 * (i % 3), max_tokens=20, ignore_eos=True, logprobs=2, n=2)
              for i in range(8)]
    want, got = plain.generate(ids, params), overlapped.generate(ids, params)
    for w, g in zip(want, got):
        for wc, gc in zip(w.outputs, g.outputs):
            assert gc.token_ids == wc.token_ids
            assert [(lp.token_id, lp.rank, [t for t, _ in lp.top]) for lp in gc.logprobs] == \
                [(lp.token_id, lp.rank, [t for t, _ in lp.top]) for lp in wc.logprobs]
            # to 1e-5, not bit for bit: on a GPU a step's batch shape picks the GEMM kernel, and the two modes do
            # not always put the same sequences in the same step
            assert [v for lp in gc.logprobs for _, v in lp.top] == \
                pytest.approx([v for lp in wc.logprobs for _, v in lp.top], abs=1e-5)


def test_penalties_and_grammars_wait_for_their_tokens_and_equal_without_it(engines):
    plain, overlapped = engines
    ids = prompts(6, seed=3)
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3, frequency_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=30, structured_output=Constraint("json_schema", schema)),
              SamplingParams(temperature=0.8, seed=7, max_tokens=16, presence_penalty=1.0, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=16, logit_bias={5: 3.0}, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)]
    assert outputs(overlapped, ids, params) == outputs(plain, ids, params)
    assert_all_blocks_free(overlapped)


def test_preemption_gives_the_same_tokens_and_returns_every_block(model):
    small = dict(OPTIONS, kv_cache_bytes=kv_cache_bytes(model, 24))  # 24 blocks for 12 growing sequences
    plain, overlapped = LLM(str(model), **small), LLM(str(model), async_scheduling=True, **small)
    ids = prompts(12, seed=4)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = outputs(plain, ids, params)
    assert outputs(overlapped, ids, params) == want
    assert overlapped.stats()["num_preemptions"] > 0
    assert_all_blocks_free(overlapped)


def test_an_abort_while_its_token_is_in_flight_leaves_the_others_unchanged(model, engines):
    plain, _ = engines
    engine = LLMEngine.from_options(str(model), async_scheduling=True, **OPTIONS)
    ids = prompts(4, seed=5)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for i, p in enumerate(ids):
        engine.add_request(f"r{i}", p, params)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    steps = 0
    while engine.has_unfinished_requests():
        for delta in engine.step():
            got[delta.request_id] += delta.seqs[0].token_ids
        steps += 1
        if steps == 6:  # r1's latest token is in flight: it is dropped, r1 ends now
            engine.abort("r1")
    want = [o.outputs[0].token_ids for o in plain.generate(ids, params)]
    assert [got["r0"], got["r2"], got["r3"]] == [want[0], want[2], want[3]]
    assert got["r1"] == want[1][: len(got["r1"])] and len(got["r1"]) < 10
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_the_engine_refuses_what_needs_each_tokens_before_the_next_step(model):
    with pytest.raises(InvalidInputError, match="async_scheduling"):
        LLMEngine.from_options(str(model), async_scheduling=True,
                               speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(InvalidInputError, match="async_scheduling"):
        LLMEngine.from_options(str(model), async_scheduling=True, tensor_parallel_size=2)


def test_streams_through_the_async_engine_equal_offline_and_leaving_early_frees_blocks(model, engines):
    plain, _ = engines
    served = AsyncLLMEngine.from_options(str(model), async_scheduling=True, **OPTIONS)
    ids = prompts(6, seed=7)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    async def stream(prompt, leave_after=None):
        tokens, text = [], ""
        async with aclosing(served.generate(served.validate(prompt, params))) as deltas:
            async for delta in deltas:
                tokens += delta.seqs[0].token_ids
                text += delta.seqs[0].text
                if len(tokens) == leave_after:
                    break
        return tokens, text

    async def main():
        return await asyncio.gather(*(stream(p, 3 if i == 2 else None) for i, p in enumerate(ids)))

    try:
        got = asyncio.run(main())
        want = [(o.outputs[0].token_ids, o.outputs[0].text) for o in plain.generate(ids, params)]
        assert [g for i, g in enumerate(got) if i != 2] == [w for i, w in enumerate(want) if i != 2]
        assert got[2][0] == want[2][0][:3]
        stats = wait_until(lambda: (s := served.stats())["num_requests"] == 0 and s)  # the abort applied
        assert stats["num_free_blocks"] == stats["num_blocks"]
    finally:
        served.shutdown()
