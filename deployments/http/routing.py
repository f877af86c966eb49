"""What every API's routes share: the app's `OpenAIFront` as a dependency, replies as JSON or server-sent events,
the OpenAPI body of a route that parses its own JSON, and checked query parameters."""

import json
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from deployments.errors import OpenAIError
from deployments.http.sse import sse_stream


async def _front(request: Request):
    """Async so FastAPI resolves it on the event loop, not on a worker thread per request. The front is
    `deployments.http.front.OpenAIFront`, which the app holds (this layer does not import it)."""
    return request.app.state.front


Front = Depends(_front)


async def respond(request: Request, body, reply: Callable[..., Awaitable], stream: Callable[..., AsyncIterator],
                  frame: Callable[[AsyncIterator], AsyncIterator[str]] = sse_stream):
    """`reply(body)` as JSON, or `stream(body)` framed as SSE by `frame` when the body asks to stream. The
    stream's first chunk is awaited here, so an error raised before it (bad input, an unknown model) is
    answered with its own status instead of a 200 stream. Top-level fields the body had but we do not know
    are named in the `x-ignored-fields` header."""
    ignored = request.state.ignored_fields
    # each name as a JSON string's inside: ASCII, control characters escaped (a header must be Latin-1 and one line)
    headers = {"x-ignored-fields": ",".join(json.dumps(k)[1:-1] for k in ignored)[:1024]} if ignored else None
    if not body.stream:
        return JSONResponse(await reply(body), headers=headers)
    chunks = stream(body)
    first = await anext(chunks)
    return StreamingResponse(frame(_prepend(first, chunks)), media_type="text/event-stream", headers=headers)


async def _prepend(first, rest):
    yield first
    async for chunk in rest:
        yield chunk


def json_body(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that parses its JSON itself (to answer 400, never 422)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def query_limit(limit: int, maximum: int) -> int:
    if not 1 <= limit <= maximum:
        raise OpenAIError(400, f"limit: must be between 1 and {maximum}", "limit")
    return limit


def query_order(order: str) -> str:
    if order not in ("asc", "desc"):
        raise OpenAIError(400, "order: must be asc or desc", "order")
    return order
