"""Helpers for streamed responses: SSE framing, ids, and merging per-prompt streams."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


SSE_DONE = sse("[DONE]")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """Interleave several async iterators as items arrive, tagging each with its stream's index.

    Leaving early (or one stream failing) cancels the others, which aborts
    their engine requests.
    """
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    finished = object()

    async def pump(index: int, stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put((index, finished))
        except Exception as e:
            await queue.put((index, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is finished:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def batched(chunks: AsyncGenerator[str, None], interval_s: float) -> AsyncIterator[str]:
    """Join the SSE chunks of one stream so at most one leaves per `interval_s`.

    Every chunk crossing Serve (replica → ingress → proxy) costs CPU on each
    hop; tokens arrive once per engine step, so joining those of one interval
    cuts that cost several-fold (Ray Serve LLM's `stream_batching_interval_ms`).
    A chunk arriving after a quiet interval leaves at once, so the first token
    is never held back; the end of the stream flushes what is pending.
    """
    if interval_s <= 0:
        async for chunk in chunks:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    pending: list[str] = []
    sent_at = -interval_s
    next_chunk = asyncio.ensure_future(anext(chunks))
    try:
        while True:
            wait_s = sent_at + interval_s - loop.time() if pending else None
            if wait_s is None or wait_s > 0:
                await asyncio.wait({next_chunk}, timeout=wait_s)
            if next_chunk.done():
                try:
                    pending.append(next_chunk.result())
                except StopAsyncIteration:
                    break
                except Exception:  # the source failed: what it produced still goes out, then the error
                    if pending:
                        yield "".join(pending)
                    raise
                next_chunk = asyncio.ensure_future(anext(chunks))
            if pending and loop.time() >= sent_at + interval_s:
                sent_at = loop.time()
                yield "".join(pending)
                pending.clear()
        if pending:
            yield "".join(pending)
    finally:  # leaving early (a client gone): stop the source, which aborts its engine request
        next_chunk.cancel()
        await asyncio.wait({next_chunk})
        await chunks.aclose()
