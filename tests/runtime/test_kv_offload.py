"""The KV offload tier (`kv_offloading_size`): full prefix blocks the pool evicts are copied to host memory and
come back on a later hit. Outputs are the same with the tier on and off; a hit from it is a cache hit
(`num_cached_tokens`); it never holds more than its bytes; a block is served only for its own adapter."""

import random

import pytest
import torch

from runtime import LLM, InvalidInputError, LoRARequest, SamplingParams
from runtime.kv_tier.host_storage import HostKVTier
from testing.lora_adapters import make_adapter
from testing.model_factory import kv_cache_bytes

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=8, ignore_eos=True)
POOL_BLOCKS = 40  # 640 tokens: a few 100-token prompts fill it, so earlier ones are evicted
TIER_BLOCKS = 72  # every full block of the 12 prompts


def _gib(path, blocks: int) -> float:
    """`kv_offloading_size` for `blocks` of the model's float32 blocks."""
    return kv_cache_bytes(path, blocks) / 2**30


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(100)] for _ in range(count)]


@pytest.fixture(scope="module")
def expected(qwen2_model):
    """Each prompt's tokens with a pool that holds them all and no tier."""
    llm = LLM(str(qwen2_model), max_model_len=256)
    prompts = _prompts(12)
    return prompts, {params.seed: [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
                     for params in (GREEDY, SEEDED)}


def _one_by_one(llm: LLM, prompts, params: SamplingParams):
    return [llm.generate([p], params)[0] for p in prompts]


def test_evicted_prefixes_come_back_from_the_tier_with_the_same_tokens(qwen2_model, expected):
    prompts, tokens = expected
    llm = LLM(str(qwen2_model), max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS),
              kv_offloading_size=_gib(qwen2_model, TIER_BLOCKS))
    for params in (GREEDY, SEEDED):
        first, again = _one_by_one(llm, prompts, params), _one_by_one(llm, prompts, params)
        assert [o.outputs[0].token_ids for o in first] == tokens[params.seed]
        assert [o.outputs[0].token_ids for o in again] == tokens[params.seed]
        # six full blocks of each 100-token prompt, long evicted from the pool, were loaded back from the tier
        assert [o.num_cached_tokens for o in again] == [96] * len(prompts)
    stats = llm.engine.stats()
    assert stats["kv_offload_hit_tokens"] >= 2 * 96 * len(prompts)
    assert 0 < stats["kv_offload_bytes"] <= stats["kv_offload_capacity_bytes"] == kv_cache_bytes(qwen2_model, 72)
    without = LLM(str(qwen2_model), max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS))
    _one_by_one(without, prompts, GREEDY)
    assert [o.num_cached_tokens for o in _one_by_one(without, prompts, GREEDY)] == [0] * len(prompts)


def test_a_small_tier_under_churn_stays_within_its_bytes_and_serves_what_it_holds(qwen2_model, expected):
    """A tier of 8 blocks behind a pool of 40, over 120 requests of the 12 prompts in a random order, three at
    a time: slots are reused while copies into and out of them are queued in the same step."""
    prompts, tokens = expected
    llm = LLM(str(qwen2_model), max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS),
              kv_offloading_size=_gib(qwen2_model, 8))
    order = random.Random(1).choices(range(len(prompts)), k=120)
    for start in range(0, len(order), 3):
        chosen = order[start : start + 3]
        outputs = llm.generate([prompts[i] for i in chosen], GREEDY)
        assert [o.outputs[0].token_ids for o in outputs] == [tokens[GREEDY.seed][i] for i in chosen]
        stats = llm.engine.stats()
        assert stats["kv_offload_bytes"] <= stats["kv_offload_capacity_bytes"] == kv_cache_bytes(qwen2_model, 8)
    assert stats["kv_offload_hit_tokens"] > 0 and stats["kv_offload_stored_blocks"] > 8


def test_a_block_is_served_for_its_own_adapter_only(qwen2_model, tmp_path):
    """The same prompt under two adapters: the one offloaded under the first is no hit for the second."""
    for name, seed in (("a", 1), ("b", 2)):
        make_adapter(qwen2_model, tmp_path / name, 8, 16, ["q_proj", "v_proj"], False, seed=seed)
    adapters = {name: LoRARequest(name, str(tmp_path / name)) for name in "ab"}
    prompt, others = _prompts(1, seed=5)[0], _prompts(6, seed=6)
    reference = LLM(str(qwen2_model), max_model_len=256, enable_lora=True)
    want = {name: reference.generate([prompt], GREEDY, lora_request=a)[0].outputs[0].token_ids
            for name, a in adapters.items()}
    assert want["a"] != want["b"]
    llm = LLM(str(qwen2_model), max_model_len=256, enable_lora=True,
              kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS), kv_offloading_size=_gib(qwen2_model, 72))
    llm.generate([prompt], GREEDY, lora_request=adapters["a"])
    _one_by_one(llm, others, GREEDY)  # push its blocks out of the pool, into the tier
    [b] = llm.generate([prompt], GREEDY, lora_request=adapters["b"])
    assert (b.outputs[0].token_ids, b.num_cached_tokens) == (want["b"], 0)
    [a] = llm.generate([prompt], GREEDY, lora_request=adapters["a"])
    assert (a.outputs[0].token_ids, a.num_cached_tokens) == (want["a"], 96)


def test_tp2_ranks_offload_their_heads_and_match_tp1(ray_cluster, qwen2_model, expected):
    prompts, tokens = expected
    # each rank holds half the KV heads: half a block's bytes
    llm = LLM(str(qwen2_model), max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS) // 2,
              kv_offloading_size=_gib(qwen2_model, TIER_BLOCKS) / 2, tensor_parallel_size=2)
    try:
        first, again = _one_by_one(llm, prompts, GREEDY), _one_by_one(llm, prompts, GREEDY)
        assert [o.outputs[0].token_ids for o in first + again] == tokens[GREEDY.seed] * 2
        assert [o.num_cached_tokens for o in again] == [96] * len(prompts)
    finally:
        llm.shutdown()


def test_copies_run_in_the_order_recorded():
    """A slot read into the pool and then written from it in one step, a block written to a slot and then
    filled from another: each copy sees what the ones before it left."""
    kv_cache = torch.arange(2 * 1 * 6 * 4, dtype=torch.float32).reshape(2, 1, 6, 4, 1, 1)
    tier = HostKVTier(3 * kv_cache[:, :, 0].numel() * 4, kv_cache)
    assert tier.num_slots == 3
    tier.slots.zero_()
    tier.slots[:, :, 0] = -1
    before = kv_cache.clone()
    tier.apply([(False, 3, 0), (True, 5, 0), (True, 1, 2), (False, 1, 0)], kv_cache)
    assert torch.equal(kv_cache[:, :, 3], torch.full_like(kv_cache[:, :, 3], -1))  # the slot's old contents
    assert torch.equal(tier.slots[:, :, 2], before[:, :, 1])  # block 1 saved before it was filled
    assert torch.equal(kv_cache[:, :, 1], before[:, :, 5])  # from slot 0, which block 5 had filled
    assert torch.equal(kv_cache[:, :, [0, 2, 4, 5]], before[:, :, [0, 2, 4, 5]])


def test_what_the_tier_cannot_hold_is_refused_at_start(qwen2_model):
    with pytest.raises(InvalidInputError, match="kv_offloading_size: holds prefix blocks: it needs enable_prefix"):
        LLM(str(qwen2_model), max_model_len=256, kv_offloading_size=0.01, enable_prefix_caching=False)
    with pytest.raises(InvalidInputError, match="kv_offloading_size: .* it runs without a draft model"):
        LLM(str(qwen2_model), max_model_len=256, kv_offloading_size=0.01,
            speculative_config={"method": "draft_model", "model": str(qwen2_model), "num_speculative_tokens": 2})
    with pytest.raises(InvalidInputError, match="kv_offloading_size: .* holds no KV block"):
        LLM(str(qwen2_model), max_model_len=256, kv_offloading_size=2**-30)
    with pytest.raises(InvalidInputError, match="kv_shared_tier: fetches into the offload tier"):
        LLM(str(qwen2_model), max_model_len=256, kv_shared_tier={"size_gib": 1})


def test_an_offloaded_block_is_served_for_its_own_cache_salt_only(qwen2_model):
    """The same prompt under two salts: the blocks offloaded under the first are no hit for the second."""
    prompt, others = _prompts(1, seed=5)[0], _prompts(6, seed=6)
    llm = LLM(str(qwen2_model), max_model_len=256, kv_cache_bytes=kv_cache_bytes(qwen2_model, POOL_BLOCKS),
              kv_offloading_size=_gib(qwen2_model, 72))

    def run(salt):
        params = SamplingParams(temperature=0, max_tokens=GREEDY.max_tokens, ignore_eos=True, cache_salt=salt)
        [out] = llm.generate([prompt], params)
        return out.outputs[0].token_ids, out.num_cached_tokens

    tokens, _ = run("a")
    _one_by_one(llm, others, GREEDY)  # push its blocks out of the pool, into the tier
    assert run("b") == (tokens, 0)
    _one_by_one(llm, others, GREEDY)
    assert run("a") == (tokens, 96)
