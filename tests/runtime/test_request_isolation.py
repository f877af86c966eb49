"""One request's failure inside the engine (a value validation missed, its text or stop handling) finishes
that request with an error; the others in the same steps finish with exactly the tokens they get alone."""

import asyncio

import pytest

from runtime import LLM, AsyncLLMEngine, RequestFailedError, SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Numbers: 0 1 2"]
PARAMS = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0.8, seed=2**63 - 1, n=2, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)]


def _run(llm: LLM, sabotage=None) -> dict:
    """Every prompt to completion, with an extra request `bad` that `sabotage(engine, "bad")` breaks once added."""
    engine = llm.engine
    for i, (prompt, params) in enumerate(zip(PROMPTS, PARAMS)):
        engine.add_request(f"r{i}", llm.tokenizer.encode(prompt), params)
    if sabotage is not None:
        engine.add_request("bad", llm.tokenizer.encode("Grüße aus München"),
                           SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
        sabotage(engine, "bad")
    deltas = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            deltas.setdefault(delta.request_id, []).append(delta)
    return deltas


def _tokens(deltas) -> dict:
    return {rid: [[t for d in ds for s in d.seqs if s.index == i for t in s.token_ids] for i in range(2)]
            for rid, ds in deltas.items() if rid != "bad"}


def _break_sampling(engine, request_id):
    # past validation: indexing the logits raises in the sampler
    engine.requests[request_id].params.logit_bias = {10**6: 1.0}


def _break_detokenizer(engine, request_id):
    detokenizer = engine.text.detokenizer(request_id, 0)
    original, calls = detokenizer.append, []

    def append(token_id, check_stop=True):
        calls.append(token_id)
        if len(calls) == 4:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return original(token_id, check_stop)

    detokenizer.append = append


@pytest.mark.parametrize("sabotage", [_break_sampling, _break_detokenizer])
def test_a_failing_request_ends_alone_and_the_others_keep_their_tokens(qwen2_model, sabotage):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=128)
    alone = _tokens(_run(llm))
    deltas = _run(llm, sabotage)
    assert _tokens(deltas) == alone
    bad = deltas["bad"]
    assert bad[-1].finished and bad[-1].error and [s.finish_reason for s in bad[-1].seqs] == ["error"]
    assert all(d.error is None for rid, ds in deltas.items() if rid != "bad" for d in ds)
    stats = llm.engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["num_requests"] == 0
    out = llm.generate([PROMPTS[0]], PARAMS[0])[0]  # the engine still serves
    assert out.error is None and len(out.outputs[0].token_ids) == 12


def test_the_stream_of_a_failing_request_raises_and_another_stream_completes(qwen2_model):
    async def main():
        engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=128)
        try:
            bad = SamplingParams(temperature=1.0, max_tokens=110, ignore_eos=True)
            good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

            async def consume(prompt, params):
                return [d async for d in engine.generate(engine.validate(prompt, params))]

            async def sabotaged():
                stream = engine.generate(engine.validate([5, 6, 7], bad))
                first = await anext(stream)  # in flight, with 109 tokens to go
                bad.logit_bias = {10**6: 1.0}  # past validation: its next sampling step raises
                return [first] + [d async for d in stream]

            bad_stream = asyncio.ensure_future(sabotaged())
            good_deltas = await consume([8, 9, 10], good)
            with pytest.raises(RequestFailedError, match="IndexError|RuntimeError"):
                await bad_stream
            assert sum(len(s.token_ids) for d in good_deltas for s in d.seqs) == 8 and good_deltas[-1].finished
            again = await consume([8, 9, 10], good)  # the engine serves on, with the same tokens
            assert [t for d in again for s in d.seqs for t in s.token_ids] == \
                [t for d in good_deltas for s in d.seqs for t in s.token_ids]
        finally:
            engine.shutdown()

    asyncio.run(main())
