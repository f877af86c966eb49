"""`deployments.streams.batched`: chunks of one interval leave joined, the first at once, nothing lost."""

import asyncio

import pytest

from deployments.streams import batched

END = object()


class Source:
    """An async generator fed by the test, recording whether it was closed before its end."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed_early = False

    async def chunks(self):
        finished = False
        try:
            while (item := await self.queue.get()) is not END:
                if isinstance(item, Exception):
                    raise item
                yield item
            finished = True
        finally:
            self.closed_early = not finished


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_first_chunk_leaves_at_once_and_the_rest_of_the_interval_is_joined():
    async def main():
        source = Source()
        out = batched(source.chunks(), interval_s=60)
        source.queue.put_nowait("data: a\n\n")
        first = await anext(out)  # the interval is 60 s: only an immediate first send returns here
        for chunk in ("data: b\n\n", "data: c\n\n", "data: [DONE]\n\n", END):
            source.queue.put_nowait(chunk)
        rest = [chunk async for chunk in out]
        return first, rest, source.closed_early

    first, rest, closed_early = run(main())
    assert first == "data: a\n\n"
    assert rest == ["data: b\n\ndata: c\n\ndata: [DONE]\n\n"]  # flushed by the end, not by the clock
    assert not closed_early


def test_an_elapsed_interval_sends_what_is_pending():
    async def main():
        source = Source()
        out = batched(source.chunks(), interval_s=0.01)
        source.queue.put_nowait("1")
        first = await anext(out)
        source.queue.put_nowait("2")
        source.queue.put_nowait("3")
        second = await anext(out)  # the source is still open: only the interval can release these
        source.queue.put_nowait(END)
        return first, second, [chunk async for chunk in out]

    assert run(main()) == ("1", "23", [])


def test_zero_interval_passes_every_chunk_through():
    async def main():
        source = Source()
        for chunk in ("a", "b", "c", END):
            source.queue.put_nowait(chunk)
        return [chunk async for chunk in batched(source.chunks(), interval_s=0)]

    assert run(main()) == ["a", "b", "c"]


def test_a_failing_source_delivers_what_it_produced_then_raises():
    async def main():
        source = Source()
        out = batched(source.chunks(), interval_s=60)
        source.queue.put_nowait("a")
        received = [await anext(out)]
        source.queue.put_nowait("b")
        source.queue.put_nowait(RuntimeError("engine step failed"))
        with pytest.raises(RuntimeError, match="engine step failed"):
            async for chunk in out:
                received.append(chunk)
        return received

    assert run(main()) == ["a", "b"]


def test_leaving_early_closes_the_source():
    async def main():
        source = Source()
        out = batched(source.chunks(), interval_s=60)
        source.queue.put_nowait("a")
        await anext(out)
        source.queue.put_nowait("b")  # pending, or being fetched, when the consumer leaves
        await out.aclose()
        return source.closed_early

    assert run(main()) is True
