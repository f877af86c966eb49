"""vLLM's `priority` field: a request's own priority orders it within its tier, on the replica's real engine."""

import asyncio

import pytest

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.format import TokenTexts
from deployments.batch.manager import BATCH_PRIORITY
from deployments.replica.adapters import ModelAdapters
from deployments.replica.handlers.chat import ChatHandler
from runtime import AsyncLLMEngine


@pytest.fixture(scope="module")
def handler(qwen2_model):
    """A replica's chat handler over an engine with one seat, so requests run one at a time."""
    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256, max_num_seqs=1)
    yield ChatHandler(engine, "m", TokenTexts(engine.tokenizer), ModelAdapters("m"))
    engine.shutdown()


def _finish_order(handler: ChatHandler, requests: list[tuple[str, dict, int]]) -> list[str]:
    """Start the requests (name, body fields, tier) in order, each once the one before is in the engine; the names
    in the order they finish."""
    finished = []

    async def run(name: str, fields: dict, tier: int):
        req = ChatCompletionRequest(messages=[{"role": "user", "content": name}], temperature=0, ignore_eos=True,
                                    **fields)
        await handler.complete(req, f"chatcmpl-{name}", tier)
        finished.append(name)

    async def main():
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(run(*request)))
            while handler.engine.stats()["num_requests"] + len(finished) < len(tasks):  # in the engine's queue
                await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return finished


def test_a_higher_priority_runs_first_and_batch_lines_after_every_online_request(handler):
    flood = [(f"low{i}", {"max_tokens": 100, "priority": 5}, 0) for i in range(3)]
    urgent = ("urgent", {"max_tokens": 2, "priority": -1}, 0)
    assert _finish_order(handler, [*flood, urgent])[0] == "urgent"
    # without the field, the same request waits its turn
    flood = [(f"low{i}", {"max_tokens": 100}, 0) for i in range(3)]
    assert _finish_order(handler, [*flood, ("urgent", {"max_tokens": 2}, 0)])[-1] == "urgent"
    # a batch line's own priority orders it among batch lines, never before an online request
    lines = [("line", {"max_tokens": 100, "priority": -(2**31)}, BATCH_PRIORITY),
             ("online", {"max_tokens": 100, "priority": 2**31 - 1}, 0)]
    assert _finish_order(handler, [("first", {"max_tokens": 100}, 0), *lines]) == ["first", "online", "line"]
