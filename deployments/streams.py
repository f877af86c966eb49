"""Helpers for streamed responses: SSE framing, ids, and merging per-prompt streams."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


SSE_DONE = sse("[DONE]")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def chunk_writer(request_id: str, object_type: str, model: str):
    """`chunk(choices, **extra)`: one SSE chunk of a response; every chunk carries the same id, object,
    creation time and model."""
    head = {"id": request_id, "object": object_type, "created": now(), "model": model}

    def chunk(choices: list[dict], **extra) -> str:
        return sse({**head, "choices": choices, **extra})

    return chunk


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
