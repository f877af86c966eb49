"""Several engine streams (one per prompt of a request) as one, in arrival order."""

import asyncio
from collections.abc import AsyncIterator


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
