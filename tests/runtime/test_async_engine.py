"""AsyncLLMEngine: streamed deltas add up to the offline result; leaving early aborts."""

import asyncio
import json
import threading
from contextlib import aclosing

import pytest

from runtime import LLM, AsyncLLMEngine, InvalidInputError, SamplingParams
from runtime.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module", params=[False, True], ids=["engine_thread", "engine_process"])
def async_engine(qwen2_model, request):
    """The engine stepped on the loop thread, and in a process of its own (runtime.engine.engine_process)."""
    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256,
                                         engine_process=request.param)
    yield engine
    engine.shutdown()


def test_streams_equal_offline_generation(async_engine, qwen2_model):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1)
    prompts = [[5 + i] * (3 + 7 * i) for i in range(12)]

    async def collect(prompt):
        tokens, text, deltas = [], "", []
        async for delta in async_engine.generate(async_engine.validate(prompt, params)):
            deltas.append(delta)
            tokens += delta.seqs[0].token_ids
            text += delta.seqs[0].text
        return tokens, text, deltas

    async def main():
        return await asyncio.gather(*(collect(p) for p in prompts))

    results = asyncio.run(main())
    offline = LLM(str(qwen2_model), dtype="float32", max_model_len=256).generate(prompts, params)
    for (tokens, text, deltas), ref in zip(results, offline):
        assert tokens == ref.outputs[0].token_ids and text == ref.outputs[0].text
        assert deltas[-1].finished and deltas[-1].seqs[0].finish_reason == "length"
        assert [d.seqs[0].num_output_tokens for d in deltas] == list(range(1, 21))
        assert all(len(d.seqs[0].logprobs) == 1 for d in deltas)


def test_leaving_the_stream_aborts_and_frees_blocks(async_engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        async def consume_three():
            seen = 0
            async with aclosing(async_engine.generate(async_engine.validate([7] * 40, params))) as stream:
                async for _ in stream:
                    seen += 1
                    if seen == 3:
                        break
            return seen

        async def hang():
            async for _ in async_engine.generate(async_engine.validate([8] * 40, params)):
                pass

        task = asyncio.create_task(hang())
        assert await consume_three() == 3
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # an empty request round-trip proves the abort commands were applied
        async for _ in async_engine.generate(async_engine.validate([9], SamplingParams(max_tokens=1))):
            pass

    asyncio.run(main())
    stats = async_engine.stats()
    assert stats["num_requests"] == 0
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_bad_request_raises_before_streaming(async_engine):
    with pytest.raises(InvalidInputError, match="max_tokens"):
        async_engine.validate([5] * 10, SamplingParams(max_tokens=1000))
    assert async_engine.healthy


def test_the_engine_is_built_on_its_loop_thread_and_a_failed_build_raises(qwen2_model):
    """Building on the loop's thread keeps every torch op on one thread (one OpenMP team on CPU)."""
    built_on = []

    def build():
        built_on.append(threading.current_thread())
        return LLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256)

    engine = AsyncLLMEngine(build)
    try:
        assert built_on == [engine._thread]
    finally:
        engine.shutdown()
    with pytest.raises(InvalidInputError, match="model"):
        AsyncLLMEngine.from_options("/nonexistent/model/dir")


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine_thread", "engine_process"])
def test_a_whole_answer_arrives_as_its_first_step_then_the_rest_merged(qwen2_model, engine_process):
    """A request not streamed gets two deltas, its first step and the rest as one, however short the interval (the
    engine process holds them back itself); one streamed beside it gets every step."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1, n=2)
    prompts = [[5 + i] * (4 + 9 * i) for i in range(6)]
    engine = AsyncLLMEngine.from_options(str(qwen2_model), delivery_interval_s=1e-6, dtype="float32",
                                         max_model_len=256, engine_process=engine_process)

    async def collect(prompt, stream):
        return [delta async for delta in engine.generate(engine.validate(prompt, params), stream=stream)]

    async def main():
        return await asyncio.gather(*(collect(p, stream=i % 2 == 1) for i, p in enumerate(prompts)))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    offline = LLM(str(qwen2_model), dtype="float32", max_model_len=256).generate(prompts, params)
    for deltas in results[1::2]:
        assert len(deltas) == 12 and [d.finished for d in deltas] == [False] * 11 + [True]
    for deltas, ref in zip(results[::2], offline[::2]):
        first, rest = deltas  # exactly two deliveries
        assert not first.finished and rest.finished
        for i, expected in enumerate(ref.outputs):
            head = next(s for s in first.seqs if s.index == i)
            tail = next(s for s in rest.seqs if s.index == i)
            assert len(head.token_ids) == 1 and head.num_output_tokens == 1
            assert head.token_ids + tail.token_ids == expected.token_ids
            assert head.text + tail.text == expected.text
            assert len(head.logprobs) + len(tail.logprobs) == 12
            assert (tail.finish_reason, tail.num_output_tokens) == ("length", 12)


def test_an_observer_sees_every_stream_start_deliver_and_end_finished_or_left(qwen2_model):
    """Metrics observe the engine (StreamObserver); a stream left early still ends, so nothing is kept open."""
    calls = []

    class Recorder:
        def started(self, request_id):
            calls.append(("started", request_id))

        def delta(self, request_id, delta):
            calls.append(("delta", request_id, sum(len(s.token_ids) for s in delta.seqs)))

        def ended(self, request_id):
            calls.append(("ended", request_id))

    engine = AsyncLLMEngine.from_options(str(qwen2_model), observer=Recorder(), dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main():
        async for _ in engine.generate(engine.validate([5, 6, 7], params), "whole"):
            pass
        async with aclosing(engine.generate(engine.validate([5, 6, 7], params), "left")) as stream:
            await anext(stream)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    whole = [c for c in calls if c[1] == "whole"]
    assert whole[0] == ("started", "whole") and whole[-1] == ("ended", "whole")
    assert sum(c[2] for c in whole if c[0] == "delta") == 5
    assert [c[0] for c in calls if c[1] == "left"] == ["started", "delta", "ended"]


def test_a_grammar_over_its_bounds_is_refused_and_the_engine_serves_on(qwen2_model, monkeypatch):
    """Over the size bound: refused before compiling. Over the time bound (here 0 s): refused at once, naming the
    field."""
    import runtime.engine.async_engine
    from runtime.text.grammar import MAX_CONSTRAINT_CHARS, Constraint

    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=128)
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'

    async def run(constraint):
        params = SamplingParams(temperature=0, max_tokens=12, structured_output=constraint)
        return [d async for d in engine.generate(engine.validate([5, 6, 7], params))]

    try:
        with pytest.raises(InvalidInputError, match="characters"):
            asyncio.run(run(Constraint("regex", "a" * (MAX_CONSTRAINT_CHARS + 1), "regex")))
        monkeypatch.setattr(runtime.engine.async_engine, "GRAMMAR_TIMEOUT_S", 0)
        with pytest.raises(InvalidInputError, match="did not compile within") as e:
            asyncio.run(run(Constraint("json_schema", schema)))
        assert e.value.param == "response_format"
        monkeypatch.undo()
        deltas = asyncio.run(run(Constraint("json_schema", schema)))
        assert deltas[-1].finished and sum(len(s.token_ids) for d in deltas for s in d.seqs) > 0
    finally:
        engine.shutdown()


def test_a_compile_over_its_bound_is_killed_while_cached_grammars_are_served(qwen2_model, monkeypatch):
    """Thousands of optional one-character properties (minutes of compiling) in both compile processes: each is
    refused at the bound and its process is gone, while a request whose grammar is cached is served meanwhile."""
    import psutil

    import runtime.engine.async_engine
    from runtime.text.grammar import Constraint

    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=128)
    cached = Constraint("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}')
    properties = {chr(0x4E00 + i): {} for i in range(3000)}
    slow = Constraint("json_schema", json.dumps({"type": "object", "properties": properties}, ensure_ascii=False,
                                                separators=(",", ":")))

    async def run(constraint):
        params = SamplingParams(temperature=0, max_tokens=8, structured_output=constraint)
        return [d async for d in engine.generate(engine.validate([5, 6, 7], params))]

    async def main():
        refused = [asyncio.create_task(run(slow)) for _ in range(2)]
        await asyncio.sleep(0.5)  # both compile processes are busy with it
        deltas = await run(cached)
        assert deltas[-1].finished and not any(task.done() for task in refused)
        return await asyncio.gather(*refused, return_exceptions=True)

    try:
        asyncio.run(run(cached))  # compiled and kept; the compile processes are up
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        monkeypatch.setattr(runtime.engine.async_engine, "GRAMMAR_TIMEOUT_S", 4)
        errors = asyncio.run(main())
        assert all(isinstance(e, InvalidInputError) and e.param == "response_format" for e in errors), errors
        assert all("did not compile within 4 s" in str(e) for e in errors)
        after = {p.pid for p in psutil.Process().children(recursive=True)}
        assert len(before - after) == 2  # the two compiling processes were killed (and replaced)
    finally:
        engine.shutdown()
