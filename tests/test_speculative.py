"""Speculative decoding: the same tokens as plain decoding (greedy, seeded), the same distribution (sampled),
exact block accounting under rejections, and plain decoding for what the verifier cannot reproduce."""

import random

import pytest

from runtime import LLM, SamplingParams
from runtime.errors import InvalidInputError
from runtime.grammar import Constraint
from runtime.speculative import speculator
from runtime.speculative.config import SpeculativeConfig
from tests.model_factory import build_model_dir, kv_cache_bytes

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def copy_prompts(llm: LLM, count: int, text_len: int = 120) -> list[list[int]]:
    """Prompts whose continuations repeat their spans: text the model wrote itself from a random start, then
    that start again. Small random weights give a model with strong n-gram habits, so it writes spans again."""
    rng = random.Random(count)
    vocab = llm.engine.spec.vocab_size
    starts = [[rng.randrange(3, vocab) for _ in range(6 + i % 5)] for i in range(count)]
    outs = llm.generate(starts, SamplingParams(temperature=0, max_tokens=text_len, ignore_eos=True))
    return [s + o.outputs[0].token_ids + s for s, o in zip(starts, outs)]


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("copy_model"), "qwen2", init_std=0.02)


@pytest.fixture(scope="module")
def plain(copy_model):
    return LLM(str(copy_model), dtype="float32", max_model_len=512, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def ngram(copy_model):
    return LLM(str(copy_model), dtype="float32", max_model_len=512, max_num_batched_tokens=64,
               speculative_config=NGRAM)


def _tokens(llm, prompts, params):
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def test_greedy_tokens_equal_plain_decoding_with_chunked_prefill_in_the_batch(plain, ngram):
    prompts = copy_prompts(plain, 16)
    prompts[3] = prompts[3] * 3  # a long prompt, prefilled in chunks beside the others' verifications
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    before = ngram.stats()
    assert _tokens(ngram, prompts, params) == _tokens(plain, prompts, params)
    stats = ngram.stats()
    assert stats["spec_num_accepted_tokens"] - before["spec_num_accepted_tokens"] > 100
    assert stats["spec_num_draft_tokens"] > stats["spec_num_accepted_tokens"]  # some were rejected too
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_seeded_sampling_gives_plain_decodings_tokens_and_logprobs(plain, ngram):
    prompts = copy_prompts(plain, 6)
    params = [SamplingParams(temperature=t, seed=s, max_tokens=30, ignore_eos=True, logprobs=2, top_k=k, n=2)
              for t, s, k in [(0.3, 1, -1), (0.7, 2, 5), (1.0, 3, -1), (0.5, -4, 3), (0.2, 5, -1), (1.0, 6, 2)]]
    before = ngram.stats()["spec_num_accepted_tokens"]
    want = plain.generate(prompts, params)
    got = ngram.generate(prompts, params)
    assert ngram.stats()["spec_num_accepted_tokens"] > before
    for w, g in zip(want, got):
        for wc, gc in zip(w.outputs, g.outputs):
            assert gc.token_ids == wc.token_ids
            assert [(lp.token_id, lp.rank) for lp in gc.logprobs] == [(lp.token_id, lp.rank) for lp in wc.logprobs]
            assert [lp.logprob for lp in gc.logprobs] == pytest.approx([lp.logprob for lp in wc.logprobs], abs=1e-4)


def test_what_the_verifier_cannot_reproduce_decodes_plainly_and_the_rest_is_honoured(plain, ngram):
    prompts = copy_prompts(plain, 7)
    text = plain.tokenizer.decode(plain.generate(prompts[4:5], SamplingParams(temperature=0, max_tokens=12))[0]
                                  .outputs[0].token_ids[6:9])
    params = [
        SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=30, presence_penalty=1.0, frequency_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=20, ignore_eos=False),
        SamplingParams(temperature=0, max_tokens=30, structured_output=Constraint("regex", "[a-z ]{4,40}")),
        SamplingParams(temperature=0, max_tokens=30, stop=[text]),
        SamplingParams(temperature=0, max_tokens=30, logit_bias={prompts[5][-1]: 3.0, 7: -100.0}),
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[prompts[6][-3]], logprobs=0),
    ]
    want = plain.generate(prompts, params)
    got = ngram.generate(prompts, params)
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].text == w.outputs[0].text
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
    assert got[4].outputs[0].finish_reason == "stop"


def test_block_accounting_is_exact_after_many_rejections_and_preemptions(qwen2_model, monkeypatch):
    from tests.test_block_accounting import _check_invariants

    monkeypatch.setattr(speculator, "MIN_REACH", 0.0)  # propose every step, however often drafts are rejected

    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=96, block_size=4, max_num_batched_tokens=40,
              kv_cache_bytes=kv_cache_bytes(qwen2_model, num_blocks=40, block_size=4),
              speculative_config={**NGRAM, "num_speculative_tokens": 6, "disable_by_batch_size": 256})
    engine = llm.engine
    rng = random.Random(0)
    for i in range(60):
        prompt = [rng.randrange(3, 11) for _ in range(rng.randrange(4, 40))]
        # sampled from 8 tokens that the prompt holds: the proposer always finds something, mostly wrong
        params = SamplingParams(temperature=1.0, max_tokens=rng.randrange(4, 40), ignore_eos=True,
                                n=rng.randrange(1, 3), logit_bias=dict.fromkeys(range(3, 11), 30.0))
        engine.add_request(f"r{i}", prompt, params)
        if i % 3 == 0:
            engine.step()
            _check_invariants(engine)
            _check_hashes(engine)
        if i % 11 == 5:
            engine.abort(f"r{i - 2}")
    while engine.has_unfinished_requests():
        engine.step()
        _check_invariants(engine)
        _check_hashes(engine)
    stats = llm.stats()
    assert stats["spec_num_draft_tokens"] - stats["spec_num_accepted_tokens"] > 300  # many rejections
    assert stats["num_preemptions"] > 0
    assert stats["num_free_blocks"] == stats["num_blocks"]


def _check_hashes(engine) -> None:
    """A registered block holds the tokens of the sequence that holds it: never a draft token."""
    bm = engine.block_manager
    for seq in engine.scheduler.running:
        assert len(seq.block_table) <= bm.blocks_for(seq.num_tokens + 1)  # rejected slots were released
        for i, block_id in enumerate(seq.block_table):
            block = bm.blocks[block_id]
            if block.hash is not None:
                assert block.token_ids == tuple(seq.token_ids[i * bm.block_size : (i + 1) * bm.block_size])


def test_speculative_config_is_checked_with_vllms_names():
    assert SpeculativeConfig.parse(NGRAM).prompt_lookup_max == 3
    for bad, field in [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                       ({"method": "ngram"}, "num_speculative_tokens"),
                       ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
                         "prompt_lookup_max": 2}, "prompt_lookup_max"),
                       ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
                       ({**NGRAM, "typo": 1}, "speculative_config")]:
        with pytest.raises(InvalidInputError, match=field):
            SpeculativeConfig.parse(bad)
