"""The engine lifecycle between rollouts (runtime.engine.lifecycle): new weights from a checkpoint give a fresh
engine's tokens on them, prefix cache included; sleep releases the KV cache and wake-up restores the outputs;
pause keeps or aborts the requests in flight, in the engine's thread and in an engine process; a trainer process
broadcasting new weights over a gloo group gives the same as a fresh engine on them."""

import asyncio
import subprocess
import sys

import pytest

from runtime import LLM, AsyncLLMEngine, InvalidInputError, SamplingParams
from runtime.distributed import free_address
from testing.model_factory import build_model_dir
from testing.weight_trainer import checkpoint_update

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8] * 10, [9, 10, 11] * 7, [5, 6, 7, 8] * 10 + [3]]  # the third hits the first's prefix


@pytest.fixture(scope="module")
def trained(qwen2_model, tmp_path_factory):
    """The same architecture with other weights: a trainer's next checkpoint."""
    return build_model_dir(tmp_path_factory.mktemp("trained"), "qwen2", seed=1)


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_new_weights_give_a_fresh_engines_tokens_and_sleep_gives_back_the_kv_cache(qwen2_model, trained, tmp_path):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    before = _tokens(llm)
    assert llm.stats()["prefix_cache_hit_tokens"] > 0  # the old weights' blocks are cached
    llm.update_weights(str(trained))
    fresh = _tokens(LLM(str(trained), dtype="float32", max_model_len=256))
    assert fresh != before and _tokens(llm) == fresh  # no block of the old weights served
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    sampled = _tokens(llm, params=seeded)
    kv_bytes = llm.stats()["kv_cache_bytes"]
    llm.sleep()
    assert kv_bytes > 0 and llm.stats()["kv_cache_bytes"] == 0 and llm.stats()["asleep"]
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(PROMPTS[:1], GREEDY)
    llm.wake_up()
    assert _tokens(llm) == fresh and _tokens(llm, params=seeded) == sampled  # woken on the new weights
    with pytest.raises(InvalidInputError, match="model_path"):
        llm.update_weights(str(tmp_path))  # no checkpoint there: refused, the weights kept
    other = build_model_dir(tmp_path / "other", "qwen2", hidden_size=32)
    with pytest.raises(InvalidInputError, match="shapes"):
        llm.update_weights(str(other))
    assert _tokens(llm) == fresh


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine_thread", "engine_process"])
def test_pause_keeps_or_aborts_requests_in_flight_and_new_weights_recompute_them(qwen2_model, trained,
                                                                                 engine_process):
    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256,
                                         engine_process=engine_process)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    async def run(prompt) -> tuple[list[int], str]:
        tokens, reason = [], None
        async for delta in engine.generate(engine.validate(prompt, params)):
            for seq in delta.seqs:
                tokens += seq.token_ids
                reason = seq.finish_reason or reason
        return tokens, reason

    async def started(task: asyncio.Task):
        while engine.stats()["num_running"] < 1 and not task.done():
            await asyncio.sleep(0.001)

    async def main():
        alone = await run([5, 6, 7])
        kept = asyncio.create_task(run([5, 6, 7]))
        await started(kept)
        await engine.lifecycle("pause", "keep")
        assert engine.stats()["paused"]
        queued = asyncio.create_task(run([9, 10]))  # taken while paused, run after
        await engine.lifecycle("resume")
        assert await kept == alone and (await queued)[1] == "length"
        aborted = asyncio.create_task(run([5, 6, 7]))
        await started(aborted)
        await engine.lifecycle("pause", "abort")
        tokens, reason = await aborted
        assert reason == "abort" and len(tokens) < 40 and engine.stats()["paused"]
        await engine.lifecycle("resume")
        changed = asyncio.create_task(run([5, 6, 7]))  # new weights under a running request
        await started(changed)
        await engine.lifecycle("pause", "keep")
        await engine.lifecycle("update_weights", str(trained))
        await engine.lifecycle("resume")
        with pytest.raises(InvalidInputError):
            await engine.lifecycle("pause", "later")
        return alone[0], (await changed)[0]

    try:
        old, changed = asyncio.run(main())
    finally:
        engine.shutdown()
    # the tokens before the change are the old weights'; it recomputed its sequence on the new ones, so the rest is
    # the new weights' greedy continuation of the prompt and those tokens
    k = next((i for i, (a, b) in enumerate(zip(old, changed)) if a != b), len(changed))
    assert k < len(changed)
    new = LLM(str(trained), dtype="float32", max_model_len=256)
    rest = SamplingParams(temperature=0, max_tokens=len(changed) - k, ignore_eos=True)
    assert new.generate([[5, 6, 7] + changed[:k]], rest)[0].outputs[0].token_ids == changed[k:]


def test_an_rl_cycle_with_weights_from_a_trainer_process(qwen2_model, trained):
    """generate, pause, join the trainer's group, receive its weights, reset the prefix cache, resume: the
    engine (in a process of its own) then answers as a fresh one on the trainer's weights."""
    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256, engine_process=True)
    body, _ = checkpoint_update(trained)
    address, port = free_address().removeprefix("tcp://").rsplit(":", 1)
    trainer = subprocess.Popen([sys.executable, "-m", "testing.weight_trainer", str(trained), address, port, "2"])

    async def answer(prompt) -> list[int]:
        tokens = []
        async for delta in engine.generate(engine.validate(prompt, GREEDY)):
            tokens += delta.seqs[0].token_ids if delta.seqs else []
        return tokens

    async def main():
        before = [await answer(p) for p in PROMPTS]
        await engine.lifecycle("pause", "keep")
        await engine.lifecycle("init_weights_update_group", address, int(port), 1, 2, "gloo")
        await engine.lifecycle("update_weights_from_distributed", body["names"], body["dtypes"], body["shapes"])
        await engine.lifecycle("reset_prefix_cache")
        await engine.lifecycle("resume")
        return before, [await answer(p) for p in PROMPTS]

    try:
        before, after = asyncio.run(main())
        assert trainer.wait(timeout=60) == 0
    finally:
        trainer.kill()
        engine.shutdown()
    assert after == _tokens(LLM(str(trained), dtype="float32", max_model_len=256)) != before
