"""The OpenAI-compatible HTTP API: FastAPI routes that validate, pick the model, and relay.

Bodies are parsed by `OpenAIFront` (front.py), so bad input never
reaches an engine; streams leave as server-sent events (framed here, at the
edge: api/sse.py); every error leaves in OpenAI's shape. The routes are the
same whichever deployment hosts them: the ingress, which reaches each model's
replicas through Serve handles, or a model's replica itself in direct
streaming (see clients.py).
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from deployments.api.anthropic.messages import AnthropicMessages, anthropic_error
from deployments.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from deployments.api.batch_protocol import ID, BatchCreateRequest
from deployments.api.embeddings import EmbeddingRequest
from deployments.api.generate_protocol import GenerateRequest
from deployments.api.protocol import ChatCompletionRequest, CompletionRequest
from deployments.api.responses.protocol import ResponsesRequest
from deployments.api.sse import event_stream, sse_stream
from deployments.api.tokenize import DetokenizeRequest, TokenizeRequest
from deployments.clients import ModelClient
from deployments.errors import OpenAIError, error_body, model_not_found
from deployments.http.disconnect import DisconnectOnCancel
from deployments.http.front import OpenAIFront
from deployments.http.metrics import RequestCounter, node_metrics_text


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


def _id(kind: str, value: str) -> str:
    """A file or batch id from the path; anything that cannot be one is not found (a NUL byte, 10 kB)."""
    if not ID.fullmatch(value):
        raise OpenAIError(404, f"No {kind} with id {value[:64]!r}", f"{kind}_id", f"{kind}_not_found")
    return value


def build_app(front: OpenAIFront) -> FastAPI:
    """The ASGI app a deployment serves (Serve's `__serve_build_asgi_app__`). With API keys on, the
    interactive docs and the OpenAPI schema are off: every route a client can reach needs a key."""
    keyed = bool(front.config.api_keys)
    app = FastAPI(title="rayllm-engine OpenAI-compatible API", docs_url=None if keyed else "/docs",
                  redoc_url=None if keyed else "/redoc", openapi_url=None if keyed else "/openapi.json")
    app.state.front = front
    app.add_middleware(RequestCounter)
    app.add_middleware(DisconnectOnCancel)
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(router)
    return app


async def _openai_error(_: Request, e: OpenAIError):
    return e.response()


async def _http_error(_: Request, e: HTTPException):
    return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code)


async def _validation_error(_: Request, e: RequestValidationError):
    return JSONResponse(error_body(400, str(e.errors())), status_code=400)


async def _front(request: Request) -> OpenAIFront:
    """Async so FastAPI resolves it on the event loop, not on a worker thread per request."""
    return request.app.state.front


async def _health_problem(client: ModelClient) -> str | None:
    """Why a model is not serving, or None when it answers healthy within 5 s."""
    try:
        healthy = await asyncio.wait_for(client.healthy(), timeout=5)
    except TimeoutError:
        return "loading (no replica answered yet)"
    except Exception as e:  # a replica that cannot answer is not healthy
        return repr(e)
    return None if healthy else "engine stopped"


async def _prepend(first, rest):
    yield first
    async for chunk in rest:
        yield chunk


def _json_body(model: type[BaseModel]) -> dict:
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


def _limit(limit: int, maximum: int) -> int:
    if not 1 <= limit <= maximum:
        raise OpenAIError(400, f"limit: must be between 1 and {maximum}", "limit")
    return limit


def _order(order: str) -> str:
    if order not in ("asc", "desc"):
        raise OpenAIError(400, "order: must be asc or desc", "order")
    return order


router = APIRouter()
Front = Depends(_front)

# --- models, health, metrics ------------------------------------------------------


@router.get("/v1/models")
async def list_models(request: Request, front: OpenAIFront = Front):
    front.auth.owner(request)
    return {"object": "list", "data": await front.models.cards()}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request, front: OpenAIFront = Front):
    front.auth.owner(request)
    card = next((c for c in await front.models.cards() if c["id"] == model_id), None)
    if card is None:
        raise model_not_found(model_id)
    return card


@router.get("/metrics")
async def metrics(request: Request, front: OpenAIFront = Front):
    front.auth.owner(request)
    return PlainTextResponse(await asyncio.to_thread(node_metrics_text), media_type="text/plain; version=0.0.4")


@router.get("/health")
async def health(front: OpenAIFront = Front):
    """Every model asked at once (one 5 s budget in all); the first unhealthy one, in config order, is named."""
    problems = await asyncio.gather(*(_health_problem(client) for client in front.models.clients.values()))
    for model_id, problem in zip(front.models.clients, problems):
        if problem is not None:
            return JSONResponse(error_body(503, f"model {model_id}: {problem}"), status_code=503)
    return {"status": "ok"}


# --- generation -------------------------------------------------------------------


@router.post("/v1/chat/completions", openapi_extra=_json_body(ChatCompletionRequest))
async def chat_completions(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, ChatCompletionRequest)
    return await respond(request, body, lambda b: model.chat(b, owner=owner), lambda b: model.chat_stream(b, owner))


@router.post("/v1/completions", openapi_extra=_json_body(CompletionRequest))
async def completions(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, CompletionRequest)
    return await respond(request, body, lambda b: model.completions(b, owner=owner),
                         lambda b: model.completions_stream(b, owner))


@router.post("/generate", openapi_extra=_json_body(GenerateRequest))
async def generate(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, GenerateRequest)
    return await respond(request, body, lambda b: model.generate(b, owner), lambda b: model.generate_stream(b, owner))


@router.post("/v1/embeddings", openapi_extra=_json_body(EmbeddingRequest))
async def embeddings(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, EmbeddingRequest)
    return await model.embeddings(body, owner=owner)


@router.post("/tokenize", openapi_extra=_json_body(TokenizeRequest))
async def tokenize(request: Request, front: OpenAIFront = Front):
    body, model, _ = await front.generation(request, TokenizeRequest)
    return await model.tokenize(body)


@router.post("/detokenize", openapi_extra=_json_body(DetokenizeRequest))
async def detokenize(request: Request, front: OpenAIFront = Front):
    body, model, _ = await front.generation(request, DetokenizeRequest)
    return await model.detokenize(body)


@router.post("/v1/responses", openapi_extra=_json_body(ResponsesRequest))
async def create_response(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = await front.body.parse(request, ResponsesRequest)
    model, responses = front.models.client(body.model), front.responses
    model_id = front.models.reply_name(body.model)
    return await respond(request, body, lambda b: responses.create(b, model, model_id, owner),
                         lambda b: responses.stream(b, model, model_id, owner), event_stream)


@router.post("/v1/messages", openapi_extra=_json_body(MessagesRequest))
async def create_message(request: Request, front: OpenAIFront = Front):
    """Anthropic's Messages API; its errors in Anthropic's shape, also those of parsing and auth."""
    try:
        body, model, owner = await front.generation(request, MessagesRequest)
        model_id = front.models.reply_name(body.model)
        return await respond(request, body, lambda b: _ANTHROPIC.create(b, model, model_id, owner),
                             lambda b: _ANTHROPIC.stream(b, model, model_id, owner), event_stream)
    except OpenAIError as e:
        return JSONResponse(anthropic_error(e.status, e.message), status_code=e.status)


@router.post("/v1/messages/count_tokens", openapi_extra=_json_body(CountTokensRequest))
async def count_message_tokens(request: Request, front: OpenAIFront = Front):
    try:
        body, model, _ = await front.generation(request, CountTokensRequest)
        return await _ANTHROPIC.count_tokens(body, model)
    except OpenAIError as e:
        return JSONResponse(anthropic_error(e.status, e.message), status_code=e.status)


_ANTHROPIC = AnthropicMessages()


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, front: OpenAIFront = Front):
    return await front.responses.retrieve(_id("response", response_id), front.auth.owner(request))


@router.get("/v1/responses/{response_id}/input_items")
async def response_input_items(response_id: str, request: Request, after: str | None = None, limit: int = 20,
                               order: str = "desc", front: OpenAIFront = Front):
    return await front.responses.input_items(_id("response", response_id), front.auth.owner(request), after,
                                             _limit(limit, 100), _order(order))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, front: OpenAIFront = Front):
    return await front.responses.delete(_id("response", response_id), front.auth.owner(request))


# --- files ------------------------------------------------------------------------


@router.post("/v1/files", openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}}}}}}})
async def upload_file(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)  # a caller without a key learns nothing, not even what the route expects
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise OpenAIError(400, "expected a multipart/form-data upload with fields file and purpose")
    form = await request.form(max_part_size=front.config.max_file_bytes)
    upload, purpose = form.get("file"), form.get("purpose")
    if upload is None or isinstance(upload, str):
        raise OpenAIError(400, "file: a file part is required", "file")
    if purpose != "batch":  # batch_output files are the server's own, made under its limits
        raise OpenAIError(400, f"purpose: expected 'batch', got {purpose!r}", "purpose")
    return await front.batches.upload(upload, purpose, owner)


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, after: str | None = None, limit: int = 10000,
                     order: str = "desc", front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    return await front.batches.list_files(purpose, after, _limit(limit, 10000), _order(order), owner)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.get_file(_id("file", file_id), front.auth.owner(request))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request, front: OpenAIFront = Front):
    content = await front.batches.file_content(_id("file", file_id), front.auth.owner(request))
    return StreamingResponse(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.delete_file(_id("file", file_id), front.auth.owner(request))


# --- batches ----------------------------------------------------------------------


@router.post("/v1/batches", openapi_extra=_json_body(BatchCreateRequest))
async def create_batch(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = await front.body.parse(request, BatchCreateRequest)
    if body.input_file_id.startswith("s3://") and not front.config.may_read_batch_input(body.input_file_id):
        raise OpenAIError(403, f"input_file_id: this server reads batch inputs only from its storage and the "
                               f"prefixes its operator allows (batch_input_prefixes), not {body.input_file_id[:200]}",
                          "input_file_id", "input_not_allowed")
    return await front.batches.create(body.input_file_id, body.endpoint, body.completion_window, body.metadata,
                                      owner)


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20, front: OpenAIFront = Front):
    return await front.batches.list(after, _limit(limit, 100), front.auth.owner(request))


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.retrieve(_id("batch", batch_id), front.auth.owner(request))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.cancel(_id("batch", batch_id), front.auth.owner(request))
