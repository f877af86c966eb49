"""Prefix marks (runtime.core.prefix_marks): the engine says which marked prefixes of recent prompts its cache
still holds (the deepest and those at powers of two), in the engine's thread or its own process, and stops saying
so once they are evicted."""

import asyncio
from dataclasses import replace

import pytest

from runtime import LLM, AsyncLLMEngine, SamplingParams
from runtime.core.prefix_marks import PrefixMarks
from testing.model_factory import kv_cache_bytes

ONE_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
PROMPT = [(7 * j) % 500 + 3 for j in range(161)]  # 10 full blocks of 16 before its last token


def _run(engine: AsyncLLMEngine, prompt: list[int], marks: tuple[int, ...] = ()) -> int:
    """Serve `prompt` with `marks`; its cached prompt tokens."""
    async def run():
        valid = replace(engine.validate(prompt, ONE_TOKEN), prefix_marks=marks)
        return [d async for d in engine.generate(valid)][-1].num_cached_tokens
    return asyncio.run(run())


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine_thread", "engine_process"])
def test_marks_are_reported_while_their_prefix_is_held_and_not_after_eviction(qwen2_model, engine_process):
    """20 blocks: the 10-block prompt stays until two other 10-block prompts take the pool; an extended prompt (the
    next turn of a conversation) replaces the one it extends, whose marks its own prefix still holds."""
    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256,
                                         kv_cache_bytes=kv_cache_bytes(qwen2_model, 20), engine_process=engine_process)
    try:
        assert engine.engine.held_prefix_marks() == []
        _run(engine, PROMPT, (11, 12, 13, 14, 15))
        assert sorted(engine.engine.held_prefix_marks()) == [11, 12, 14, 15]
        assert _run(engine, PROMPT + [9] * 80, (11, 12, 13, 14, 15, 16, 17, 18)) == 160
        assert sorted(engine.engine.held_prefix_marks()) == [11, 12, 14, 18]
        for i in (1, 2):  # unmarked prompts evict the marked one's blocks, oldest first
            _run(engine, [(11 * j + i) % 500 + 3 for j in range(161)])
        assert engine.engine.held_prefix_marks() == []
        assert _run(engine, PROMPT, (11, 12, 13, 14, 15)) == 0  # the report was right: nothing was held
    finally:
        engine.shutdown()


def test_without_prefix_caching_no_mark_is_kept(qwen2_model):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, enable_prefix_caching=False)
    engine = llm.engine
    engine.enqueue("r", replace(engine.validator.validate(PROMPT, ONE_TOKEN), prefix_marks=(1, 2)))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.held_prefix_marks() == [] and len(engine.block_manager.prefix_marks) == 0


def test_a_prompt_held_in_part_reports_the_marks_of_that_part():
    marks = PrefixMarks(max_blocks=100)
    marks.track([101, 102, 103, 104, 105, 106], tuple(range(1, 13)))
    assert sorted(marks.held({101, 102, 103, 104, 105, 106}.__contains__)) == [1, 2, 4, 8, 12]
    assert sorted(marks.held({101, 102, 103}.__contains__)) == [1, 2, 4, 6]  # half the blocks: half the marks
    assert sorted(marks.held({101}.__contains__)) == [1, 2]
    assert marks.held(set().__contains__) == []


def test_kept_prompts_are_bounded_in_blocks_least_recent_first():
    marks = PrefixMarks(max_blocks=6)
    marks.track([1, 2, 3], (10,))
    marks.track([4, 5, 6], (20,))
    marks.track([1, 2, 3], (10,))  # sent again: the most recent
    marks.track([7, 8], (30,))  # over 6 blocks: [4, 5, 6] goes
    assert sorted(marks.held(lambda h: True)) == [10, 30] and len(marks) == 2
