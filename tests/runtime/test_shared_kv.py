"""The KV tier shared by the engines of a Ray cluster (`kv_shared_tier`): a prompt one engine computed is a cache
hit on another, offline and in a server's engine, between replicas holding the same weights only; the tokens are
the same as without the tier; tiers of other names, short prompts and blocks whose publisher died are not
served."""

import asyncio
import random
import uuid

import pytest
import ray

from runtime import LLM, AsyncLLMEngine, SamplingParams
from runtime.kv_tier.shared import DIRECTORY_PREFIX
from testing.helpers import wait_until
from testing.model_factory import build_model_dir

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
FULL_BLOCKS = (1000 - 1) // 16 * 16  # a 1,000-token prompt's blocks but the one holding its last token


def _options(name: str) -> dict:
    return dict(max_model_len=1100, kv_offloading_size=0.01,
                kv_shared_tier={"size_gib": 0.05, "name": name, "min_prompt_tokens": 256})


@pytest.fixture
def name(ray_cluster):
    """A tier name of the test's own; its directory actor (detached, as a server's) is killed after it."""
    name = f"test-{uuid.uuid4()}"
    yield name
    for directory in (name, name + "-elsewhere"):
        try:
            ray.kill(ray.get_actor(DIRECTORY_PREFIX + directory, namespace="rayllm"))
        except ValueError:  # never created
            pass


@pytest.fixture(scope="module")
def prompts(qwen2_model):
    """Two 1,000-token prompts and their tokens from an engine without the tier."""
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 500) for _ in range(1000)] for _ in range(2)]
    llm = LLM(str(qwen2_model), max_model_len=1100)
    return prompts, [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def test_a_prompt_one_engine_computed_is_a_hit_on_another(name, qwen2_model, prompts):
    (prompt, _), (expected, _) = prompts
    a, b = LLM(str(qwen2_model), **_options(name)), LLM(str(qwen2_model), **_options(name))
    [first] = a.generate([prompt], GREEDY)
    a.engine.shared_tier.flush()
    [second] = b.generate([prompt], GREEDY)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == expected
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, FULL_BLOCKS)
    assert b.engine.stats()["kv_shared_fetched_blocks"] == FULL_BLOCKS // 16
    directory = ray.get_actor(DIRECTORY_PREFIX + name, namespace="rayllm")
    assert ray.get(directory.stats.remote())["blocks"] == FULL_BLOCKS // 16
    elsewhere = LLM(str(qwen2_model), **_options(name + "-elsewhere"))
    assert elsewhere.generate([prompt], GREEDY)[0].num_cached_tokens == 0
    [short] = a.generate([prompt[:200]], GREEDY)  # under min_prompt_tokens: a hit on a's pool, not published
    a.engine.shared_tier.flush()
    assert short.num_cached_tokens == 192 and ray.get(directory.stats.remote())["blocks"] == FULL_BLOCKS // 16


def test_blocks_are_shared_only_between_replicas_holding_the_same_weights(name, qwen2_model, prompts, tmp_path):
    """One replica updated from a trainer's checkpoint never takes the other's blocks of the old weights; once both
    hold the update (or a replica starts on that checkpoint) they share again. A trainer's named versions (SGLang's
    weight_version) are shared as named; a prefix-cache reset changes nothing."""
    (prompt, _), _ = prompts
    trained = build_model_dir(tmp_path / "trained", "qwen2", seed=1)
    expected = LLM(str(trained), max_model_len=1100).generate([prompt], GREEDY)[0].outputs[0].token_ids
    a, b = LLM(str(qwen2_model), **_options(name)), LLM(str(qwen2_model), **_options(name))

    def run(llm: LLM) -> tuple[list[int], int]:
        [out] = llm.generate([prompt], GREEDY)
        llm.engine.shared_tier.flush()
        return out.outputs[0].token_ids, out.num_cached_tokens

    a.update_weights(str(trained))
    old, _ = run(b)  # published under the old weights
    assert old != expected and run(a) == (expected, 0)  # 0 cross-weights hits
    b.update_weights(str(trained))
    assert run(b) == (expected, FULL_BLOCKS)  # both hold the update: a's blocks serve b
    assert run(LLM(str(trained), **_options(name))) == (expected, FULL_BLOCKS)  # so does a replica started on it
    a.update_weights(str(qwen2_model), weight_version="step-7")
    b.update_weights(str(qwen2_model), weight_version="step-8")
    b.reset_prefix_cache()
    assert run(a) == (old, 0) and run(b) == (old, 0)  # other names: not shared, though the weights are the same
    b.update_weights(str(qwen2_model), weight_version="step-7")
    assert run(b) == (old, FULL_BLOCKS)


def test_a_cache_salt_is_a_tenants_own_in_the_shared_tier(name, qwen2_model, prompts):
    (prompt, _), (expected, _) = prompts
    a, b = LLM(str(qwen2_model), **_options(name)), LLM(str(qwen2_model), **_options(name))

    def run(llm: LLM, salt: str) -> tuple[list[int], int]:
        params = SamplingParams(temperature=0, max_tokens=GREEDY.max_tokens, ignore_eos=True, cache_salt=salt)
        [out] = llm.generate([prompt], params)
        llm.engine.shared_tier.flush()
        return out.outputs[0].token_ids, out.num_cached_tokens

    assert run(a, "tenant-a") == (expected, 0)
    assert run(b, "tenant-b") == (expected, 0)  # a's blocks are not b's tenant's
    assert run(b, "tenant-a") == (expected, FULL_BLOCKS)


def test_a_servers_engine_fetches_before_queueing(name, qwen2_model, prompts):
    (_, prompt), (_, expected) = prompts
    publisher = LLM(str(qwen2_model), **_options(name))
    publisher.generate([prompt], GREEDY)
    publisher.engine.shared_tier.flush()
    engine = AsyncLLMEngine.from_options(str(qwen2_model), **_options(name))

    async def run():
        valid = engine.engine.validator.validate(prompt, GREEDY)
        return [delta async for delta in engine.generate(valid)]

    try:
        deltas = asyncio.run(run())
    finally:
        engine.shutdown()
    assert [t for d in deltas for s in d.seqs for t in s.token_ids] == expected
    assert deltas[-1].num_cached_tokens == FULL_BLOCKS


@ray.remote
class _Publisher:
    """An engine in another process, which publishes and then dies."""

    def __init__(self, path: str, name: str):
        self.llm = LLM(path, **_options(name))

    def run(self, prompt: list[int]) -> None:
        self.llm.generate([prompt], GREEDY)
        self.llm.engine.shared_tier.flush()


def test_blocks_of_a_dead_publisher_are_recomputed_and_published_again(name, qwen2_model, prompts):
    (prompt, _), (expected, _) = prompts
    publisher = _Publisher.remote(str(qwen2_model), name)
    ray.get(publisher.run.remote(prompt))
    ray.kill(publisher)
    directory = ray.get_actor(DIRECTORY_PREFIX + name, namespace="rayllm")
    [(_, boxed, _)] = ray.get(directory.lookup.remote(_first_hash(qwen2_model, name, prompt)))

    def lost() -> bool:  # its store may serve the object a little longer
        try:
            ray.get(boxed[0], timeout=5)
        except ray.exceptions.ObjectLostError:
            return True
        return False

    wait_until(lost, timeout=60, every=0.5)
    llm = LLM(str(qwen2_model), **_options(name))
    [out] = llm.generate([prompt], GREEDY)
    assert (out.outputs[0].token_ids, out.num_cached_tokens) == (expected, 0)
    llm.engine.shared_tier.flush()  # it published them anew, in its own store
    [again] = LLM(str(qwen2_model), **_options(name)).generate([prompt], GREEDY)
    assert (again.outputs[0].token_ids, again.num_cached_tokens) == (expected, FULL_BLOCKS)


def _first_hash(path, name: str, prompt: list[int]) -> list[int]:
    """The hash of `prompt`'s first block, as an engine of the tier computes it."""
    llm = LLM(str(path), **_options(name))
    return llm.engine.block_manager.prompt_hashes(prompt, None)[0][:1]


def _blocks_held(directory) -> int | None:
    """The directory's blocks; None while Ray restarts it."""
    try:
        return ray.get(directory.stats.remote())["blocks"]
    except ray.exceptions.ActorUnavailableError:
        return None


def test_the_directory_comes_back_empty_after_its_process_dies(name, qwen2_model, prompts):
    """Ray restarts the directory empty; an engine then computes the prompt itself (no error), publishes it
    again, and a third engine hits it. (An engine asking while the directory restarts waits at most
    LOOKUP_TIMEOUT_S, a bound the restart may outlast on a busy machine: the test waits for the restart.)"""
    (prompt, _), (expected, _) = prompts
    a = LLM(str(qwen2_model), **_options(name))
    a.generate([prompt], GREEDY)
    a.engine.shared_tier.flush()
    directory = ray.get_actor(DIRECTORY_PREFIX + name, namespace="rayllm")
    ray.kill(directory, no_restart=False)
    # the kill lands after the call returns: the directory answers with its blocks until then, 0 once restarted
    wait_until(lambda: _blocks_held(directory) == 0, timeout=60, every=0.1)
    b = LLM(str(qwen2_model), **_options(name))
    [out] = b.generate([prompt], GREEDY)
    assert (out.outputs[0].token_ids, out.num_cached_tokens) == (expected, 0)
    b.engine.shared_tier.flush()
    assert ray.get(directory.stats.remote())["blocks"] == FULL_BLOCKS // 16  # restarted, refilled by b
    [again] = LLM(str(qwen2_model), **_options(name)).generate([prompt], GREEDY)
    assert (again.outputs[0].token_ids, again.num_cached_tokens) == (expected, FULL_BLOCKS)
