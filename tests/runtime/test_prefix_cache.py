"""Prefix caching: hits are reported, change no token, survive eviction pressure, and go on a reset."""

from runtime import LLM, SamplingParams
from testing.model_factory import kv_cache_bytes

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _shared_prefix_prompts(tokenizer):
    prefix = list(range(3, 303))  # 300 tokens
    return prefix + tokenizer.encode(" first question"), prefix + tokenizer.encode(" another one here")


def test_shared_prefix_is_served_from_cache(qwen2_model):
    cached = LLM(str(qwen2_model), dtype="float32", max_model_len=512)
    a, b = _shared_prefix_prompts(cached.tokenizer)
    first = cached.generate([a], GREEDY)[0]
    second = cached.generate([b], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 288  # 18 full blocks of 16 of the 300 shared tokens

    uncached = LLM(str(qwen2_model), dtype="float32", max_model_len=512, enable_prefix_caching=False)
    plain = uncached.generate([a, b], GREEDY)
    assert [o.num_cached_tokens for o in plain] == [0, 0]
    assert first.outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert second.outputs[0].token_ids == plain[1].outputs[0].token_ids


def test_identical_prompt_leaves_last_token_to_compute(qwen2_model):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    prompt = list(range(3, 67))  # exactly 4 blocks
    llm.generate([prompt], GREEDY)
    again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == 48  # the 4th block holds the token whose logits we need


def test_eviction_under_pressure_stays_correct(qwen2_model):
    # 40 blocks: each 200-token prompt takes 13, so caching more than two evicts older prefixes
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, 40))
    reference = LLM(str(qwen2_model), dtype="float32", max_model_len=256, enable_prefix_caching=False)
    prompts = [[(7 * i + j) % 500 + 3 for j in range(200)] for i in range(6)]
    order = [0, 1, 2, 0, 3, 4, 1, 5, 0, 2]
    expected = {i: o.outputs[0].token_ids for i, o in enumerate(reference.generate(prompts, GREEDY))}
    hits = []
    for i in order:
        out = llm.generate([prompts[i]], GREEDY)[0]
        assert out.outputs[0].token_ids == expected[i]
        hits.append(out.num_cached_tokens)
    assert hits[3] == 192  # prompt 0 again, still cached
    assert 0 in hits[4:]  # some repeat found its prefix evicted
    stats = llm.engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_n_completions_share_prompt_blocks(qwen2_model):
    for caching in (True, False):
        llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, enable_prefix_caching=caching)
        prompt = list(range(3, 103))  # 100 tokens: 6 full blocks
        out = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True))[0]
        assert len(out.outputs) == 4
        assert llm.engine.stats()["prefix_cache_hit_tokens"] == 3 * 96  # siblings 2..4 reuse sibling 1's blocks
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_a_reset_forgets_every_cached_prefix(qwen2_model):
    """With the weights unchanged: the prompt cached before the reset is computed again after it, then cached."""
    llm = LLM(str(qwen2_model), max_model_len=256, block_size=16)
    prompt = list(range(5, 105))
    first = llm.generate([prompt], GREEDY)[0]
    assert llm.generate([prompt], GREEDY)[0].num_cached_tokens == 96
    llm.reset_prefix_cache()
    again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.generate([prompt], GREEDY)[0].num_cached_tokens == 96


def test_requests_of_another_cache_salt_never_share_a_prefix(qwen2_model):
    """vLLM's cache_salt: the same prompt under another salt is computed anew (same tokens), under its own a hit."""
    llm = LLM(str(qwen2_model), max_model_len=256, block_size=16)
    prompt = list(range(5, 105))

    def run(salt):
        [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, cache_salt=salt))
        return out.outputs[0].token_ids, out.num_cached_tokens

    tokens, _ = run("tenant-a")
    assert run("tenant-b") == (tokens, 0) and run(None) == (tokens, 0)
    assert run("tenant-a") == run("tenant-b") == (tokens, 96)


def test_a_pinned_prefix_outlives_the_pressure_that_evicts_an_unpinned_one(qwen2_model):
    # 40 blocks: a 200-token prompt and its 12 tokens take 14; three others after it evict it, unless pinned (an
    # owner pins at most a quarter of the pool: 10 of its 12 full blocks)
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, 40))
    prompts = [[(11 * i + j) % 500 + 3 for j in range(200)] for i in range(8)]
    pinned = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, pin_prefix_tokens=200, pin_ttl_s=60)
    hits = {}
    for name, first, params in (("unpinned", 0, GREEDY), ("pinned", 4, pinned)):
        alone = llm.generate([prompts[first]], params)[0]
        for other in prompts[first + 1:first + 4]:
            llm.generate([other], GREEDY)
        again = llm.generate([prompts[first]], params)[0]
        assert again.outputs[0].token_ids == alone.outputs[0].token_ids  # a hit or not, the same tokens
        hits[name] = again.num_cached_tokens
    assert hits == {"unpinned": 0, "pinned": 160}
    stats = llm.engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
