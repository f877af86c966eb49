"""Speculative decoding: the same tokens as plain decoding (greedy, seeded), the same distribution (sampled),
exact block accounting under rejections, and plain decoding for what the verifier cannot reproduce."""

import random
from types import SimpleNamespace

import pytest

from runtime import LLM, SamplingParams
from runtime.config import SpeculativeConfig
from runtime.errors import InvalidInputError
from runtime.speculative import speculator
from runtime.speculative.ngram import NgramProposer
from runtime.speculative.speculator import SequenceSpeculation
from runtime.text.grammar import Constraint
from testing.model_factory import build_model_dir, kv_cache_bytes
from testing.mtp_checkpoint import add_mtp_layer, mtp_first_draft
from tests.runtime.test_hybrid_attention import _prompts as hybrid_prompts
from tests.runtime.test_model_families import FAMILIES

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
    from tests.runtime.test_block_accounting import _check_invariants

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
                       ({"method": "mtp", "num_speculative_tokens": 2, "model": "a-draft"}, "model"),
                       ({**NGRAM, "typo": 1}, "speculative_config")]:
        with pytest.raises(InvalidInputError, match=field):
            SpeculativeConfig.parse(bad)



def test_prompt_lookup_copies_on_past_the_sequences_end_at_the_matchs_distance():
    proposer = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=3)
    for tokens, k, want in [([9, 4, 5, 6, 7, 8, 4, 5], 3, [6, 7, 8]),  # room enough: what followed the match
                            ([9, 7, 7, 7], 4, [7, 7, 7, 7]),  # a run: its latest occurrence is one back
                            ([9, 3, 4, 3, 4], 5, [3, 4, 3, 4, 3]),  # a cycle of two
                            ([2, 3, 4, 5], 2, [])]:  # no suffix recurs
        assert proposer.propose(SimpleNamespace(token_ids=tokens), SequenceSpeculation(), k) == want


def _tiny_vocab_model(path, vocab: int = 8):
    """A one-layer model over 8 tokens (the tokenizer is larger; only ids below 8 are used)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from testing.model_factory import build_tokenizer

    tokenizer = build_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=[eos], bos_token_id=None).save_pretrained(path)
    return path


def _chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a `df`-degree statistic exceeds with probability 0.001 (Wilson-Hilferty)."""
    c = 2 / (9 * df)
    return df * (1 - c + z * c**0.5) ** 3


def _excess_over_critical(path) -> tuple[list[float], dict]:
    """Chi-square two-sample statistics of speculative vs plain samples (3,000 each) over output tokens 1 to 3
    (the verified ones) and pairs of them, each divided by its 0.001 critical value; and the acceptance rate."""
    prompt = [3, 4, 5, 6, 3, 4, 5, 7, 3, 4]  # every token recurs: the proposer always has a guess
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, n=100)
    samples = {}
    for name, extra in [("plain", {"seed": 1}),
                        ("ngram", {"seed": 2, "speculative_config": {**NGRAM, "disable_by_batch_size": 256}})]:
        llm = LLM(str(path), dtype="float32", max_model_len=64, **extra)
        samples[name] = [tuple(c.token_ids) for o in llm.generate([prompt] * 30, params) for c in o.outputs]
    ratios = []
    for positions in [(1,), (2,), (3,), (1, 2), (2, 3)]:
        plain, spec = ([tuple(t[i] for i in positions) for t in samples[k]] for k in ("plain", "ngram"))
        bins = set(plain) | set(spec)
        a, b = ({k: v.count(k) for k in bins} for v in (plain, spec))
        statistic = sum((a[k] - b[k]) ** 2 / (a[k] + b[k]) for k in bins)
        ratios.append(statistic / _chi_square_critical(len(bins) - 1))
    return ratios, llm.stats()


def test_sampled_tokens_have_plain_decodings_distribution_at_temperature_1(tmp_path, monkeypatch):
    path = _tiny_vocab_model(tmp_path / "tiny_vocab")
    ratios, stats = _excess_over_critical(path)
    assert stats["spec_acceptance_rate"] > 0.05 and stats["spec_num_draft_tokens"] > 3000
    assert max(ratios) < 1, ratios
    # the same test catches a wrong rule: a draft also accepted when the target sampled its neighbour
    monkeypatch.setattr("runtime.worker.verifier.accepted_length", lambda drafts, samples: next(
        (i for i, (d, s) in enumerate(zip(drafts, samples)) if abs(d - s) > 1), len(drafts)))
    assert max(_excess_over_critical(path)[0]) > 1


def test_a_draft_model_gives_plain_decodings_tokens_and_a_draft_equal_to_the_target_accepts_all(
        copy_model, plain, tmp_path):
    prompts = copy_prompts(plain, 16)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=24, ignore_eos=True)
    want, want_seeded = _tokens(plain, prompts, greedy), _tokens(plain, prompts[:4], seeded)
    small = build_model_dir(tmp_path / "draft", "qwen2", hidden_size=32, intermediate_size=64, num_layers=1,
                            init_std=0.02, seed=1)
    for draft, all_accepted in [(copy_model, True), (small, False)]:
        llm = LLM(str(copy_model), dtype="float32", max_model_len=512, max_num_batched_tokens=64,
                  speculative_config={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3})
        assert _tokens(llm, prompts, greedy) == want
        stats = llm.stats()
        assert stats["spec_num_draft_tokens"] > 100
        if all_accepted:
            assert stats["spec_acceptance_rate"] == 1.0
        assert _tokens(llm, prompts[:4], seeded) == want_seeded
        assert llm.stats()["num_free_blocks"] == stats["num_blocks"]


def test_a_draft_model_with_another_vocabulary_is_refused_naming_it(copy_model, tmp_path):
    other = build_model_dir(tmp_path / "other_vocab", "qwen2", vocab_size=640)
    with pytest.raises(InvalidInputError, match=f"speculative_config.model: the draft model {other} has a vocabulary"):
        LLM(str(copy_model), dtype="float32", max_model_len=128,
            speculative_config={"method": "draft_model", "model": str(other), "num_speculative_tokens": 2})



def test_a_draft_model_beside_a_target_whose_every_layer_slides_is_refused(tmp_path):
    target = build_model_dir(tmp_path / "sliding", "mistral", sliding_window=16)
    with pytest.raises(InvalidInputError, match="speculative_config: a draft model cannot run beside a target whose"):
        LLM(str(target), dtype="float32", max_model_len=128,
            speculative_config={"method": "draft_model", "model": str(target), "num_speculative_tokens": 2})
    # prompt lookup needs no draft KV: past the window, with blocks freed behind it, its tokens are plain decoding's
    prompts, greedy = [[5, 6, 7, 8] * 10], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(target), dtype="float32", max_model_len=128).generate(prompts, greedy)
    speculating = LLM(str(target), dtype="float32", max_model_len=128,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    assert speculating.generate(prompts, greedy)[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert speculating.stats()["spec_num_draft_tokens"] > 0


@pytest.fixture(scope="module", params=["deepseek_v3", "glm4_moe"])
def mtp_model(request, tmp_path_factory):
    """A tiny DeepSeek-V3, or GLM-4.5, with a multi-token-prediction layer after its last decoder layer."""
    family = request.param
    source = build_model_dir(tmp_path_factory.mktemp(family), family, **FAMILIES[family])
    return add_mtp_layer(source, tmp_path_factory.mktemp(f"{family}_mtp"))


def test_the_checkpoints_prediction_layer_drafts_and_plain_decodings_tokens_come_out(mtp_model):
    """Prompts of up to 95 tokens prefilled in chunks of 32, the prediction layer catching up on each chunk; its
    first draft after a prompt is transformers' (its decoder layer as a one-layer model of the family over the
    target's hidden states); greedy and seeded tokens are plain decoding's."""
    options = {"dtype": "float32", "max_model_len": 256, "max_num_batched_tokens": 32}
    plain = LLM(str(mtp_model), **options)
    prompts = hybrid_prompts(plain.tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=16)
    llm = LLM(str(mtp_model), speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **options)
    assert _tokens(llm, prompts, greedy) == _tokens(plain, prompts, greedy)
    assert _tokens(llm, prompts[:3], seeded) == _tokens(plain, prompts[:3], seeded)
    stats = llm.stats()
    assert stats["spec_num_draft_tokens"] > stats["spec_num_drafts"] > 20  # first drafts, and second ones
    assert stats["num_free_blocks"] == stats["num_blocks"]
    engine = llm.engine
    engine.add_request("first", prompts[7], SamplingParams(temperature=0, max_tokens=4))
    seq = engine.requests["first"].seqs[0]
    while seq.num_output_tokens == 0:
        engine.step()
    assert seq.speculation.next_draft[:2] == (seq.num_tokens, mtp_first_draft(mtp_model, seq.token_ids))


def test_mtp_without_a_prediction_layer_in_the_checkpoint_is_refused(copy_model):
    with pytest.raises(InvalidInputError, match="speculative_config.method: mtp: .* has no multi-token-prediction"):
        LLM(str(copy_model), dtype="float32", max_model_len=128,
            speculative_config={"method": "mtp", "num_speculative_tokens": 1})
