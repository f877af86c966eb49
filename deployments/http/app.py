"""The OpenAI-compatible HTTP app: each API's routes (routes/; the Responses, Anthropic and Conversations
adapters' in their own folders), and the app's own: models, health and metrics.

Bodies are parsed by `OpenAIFront` (front.py), so bad input never reaches an engine; streams leave as
server-sent events (framed at the edge: sse.py); every error leaves in OpenAI's shape. The app is the same
whichever deployment hosts it: the ingress, which reaches each model's replicas through Serve handles, or a
model's replica itself in direct streaming (see clients.py).
"""

import asyncio

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from deployments.clients import ModelClient
from deployments.errors import OpenAIError, error_body, model_not_found
from deployments.http import admin
from deployments.http.anthropic import routes as anthropic
from deployments.http.conversations import routes as conversations
from deployments.http.disconnect import DisconnectOnCancel
from deployments.http.front import OpenAIFront
from deployments.http.key_admission import KeyAdmission
from deployments.http.metrics import RequestCounter, node_metrics_text
from deployments.http.request_limits import RequestLimits
from deployments.http.responses import routes as responses
from deployments.http.routes import batches, chat, completions, embeddings, generate, scores, tokenize
from deployments.http.routing import Front
from deployments.http.stalled_streams import StalledStreamGuard
from deployments.tracing import HttpSpans, tracing

router = APIRouter()
ROUTERS = (router, chat.router, completions.router, generate.router, embeddings.router, scores.router,
           tokenize.router, responses.router, conversations.router, anthropic.router, batches.router, admin.router)


def build_app(front: OpenAIFront) -> FastAPI:
    """The ASGI app a deployment serves (Serve's `__serve_build_asgi_app__`). With API keys on, the
    interactive docs and the OpenAPI schema are off: every route a client can reach needs a key."""
    keyed = bool(front.config.api_keys)
    app = FastAPI(title="rayllm-engine OpenAI-compatible API", docs_url=None if keyed else "/docs",
                  redoc_url=None if keyed else "/redoc", openapi_url=None if keyed else "/openapi.json")
    app.state.front = front
    config = front.config
    # outermost last: a client that stops reading let go (where the app writes to its connection: direct ingress),
    # Serve's cancellation as a disconnect, then counting, header and body bounds, key admission
    in_flight, waiting = config.key_bounds_per_replica()
    app.add_middleware(KeyAdmission, keys=front.auth, max_in_flight=in_flight, max_waiting=waiting)
    app.add_middleware(RequestLimits, max_headers=config.max_headers, max_header_bytes=config.max_header_bytes,
                       body_grace_s=config.body_grace_s, min_body_bytes_per_s=config.min_body_bytes_per_s)
    app.add_middleware(RequestCounter)
    app.add_middleware(DisconnectOnCancel)
    app.add_middleware(StalledStreamGuard)
    if tracing():
        app.add_middleware(HttpSpans)
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    for api_router in ROUTERS:
        app.include_router(api_router)
    return app


async def _openai_error(_: Request, e: OpenAIError):
    return e.response()


async def _http_error(_: Request, e: HTTPException):
    return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code)


async def _validation_error(_: Request, e: RequestValidationError):
    return JSONResponse(error_body(400, str(e.errors())), status_code=400)


async def _health_problem(client: ModelClient) -> str | None:
    """Why a model is not serving, or None when it answers healthy within 5 s."""
    try:
        healthy = await asyncio.wait_for(client.healthy(), timeout=5)
    except TimeoutError:
        return "loading (no replica answered yet)"
    except Exception as e:  # a replica that cannot answer is not healthy
        return repr(e)
    return None if healthy else "engine stopped"


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
