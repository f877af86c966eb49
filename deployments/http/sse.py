"""Server-sent events: where a stream's items become the bytes on the wire, at the HTTP edge and only there.

A stream (a `ModelClient`'s, or the Responses API's) yields its chunks as dicts, ending either when it is
done or with a `StreamError`; `sse_stream` frames each as `data: {...}`, the error as OpenAI's in-band error
event, and ends with `data: [DONE]`. Responses' events are named (`event:` lines) and carry no `[DONE]`.
"""

import json
from collections.abc import AsyncIterator

from deployments.errors import StreamError


def sse(payload: dict | str, event: str | None = None) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


SSE_DONE = sse("[DONE]")


async def sse_stream(items: AsyncIterator[dict | StreamError]) -> AsyncIterator[str]:
    """A chat, completions or /generate stream as SSE, `[DONE]` last (also after an error)."""
    async for item in items:
        yield sse(item.body() if isinstance(item, StreamError) else item)
    yield SSE_DONE


async def event_stream(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    """A Responses stream as SSE: each event named by its `type`, no `[DONE]`."""
    async for event in events:
        yield sse(event, event=event["type"])
