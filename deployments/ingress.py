"""The HTTP front door: thin FastAPI routes that validate, pick the model's replicas, and relay.

Bodies are parsed here (so bad input never costs a replica call) and
forwarded through a DeploymentHandle; streams are relayed as server-sent
events. Every error leaves in OpenAI's shape.
"""

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from deployments.app_config import AppConfig, replica_name
from deployments.auth import ApiKeys
from deployments.batch.api import BatchAPI
from deployments.batch.files import FileLimits
from deployments.batch.job import BatchLimits
from deployments.errors import OpenAIError, error_body, from_validation_error
from deployments.metrics import RequestCounter, node_metrics_text
from deployments.protocol import BatchCreateRequest, ChatCompletionRequest, CompletionRequest, GenerateRequest

app = FastAPI(title="rayllm-engine OpenAI-compatible API")
app.add_middleware(RequestCounter)


@app.exception_handler(OpenAIError)
async def _openai_error(_: Request, e: OpenAIError):
    return e.response()


@app.exception_handler(HTTPException)
async def _http_error(_: Request, e: HTTPException):
    return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code)


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, e: RequestValidationError):
    return JSONResponse(error_body(400, str(e.errors())), status_code=400)


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


def _limit(limit: int, maximum: int) -> int:
    if not 1 <= limit <= maximum:
        raise OpenAIError(400, f"limit: must be between 1 and {maximum}", "limit")
    return limit


def _order(order: str) -> str:
    if order not in ("asc", "desc"):
        raise OpenAIError(400, "order: must be asc or desc", "order")
    return order


async def _health_problem(handle: DeploymentHandle) -> str | None:
    """Why a model's replicas are not serving, or None when one answers healthy within 5 s."""
    try:
        healthy = await asyncio.wait_for(handle.healthy.remote(), timeout=5)
    except TimeoutError:
        return "loading (no replica answered yet)"
    except Exception as e:  # a replica that cannot answer is not healthy
        return repr(e)
    return None if healthy else "engine stopped"


async def _relay_stream(first: str, rest):
    yield first
    async for chunk in rest:
        yield chunk


# No CPU reserved: like Serve's proxy, the ingress only routes; the cores go to the engines.
@serve.deployment(max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class OpenAIIngress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle]):
        self.config = config
        self.replicas = replicas
        self.sources = {c.model_id: c.model_loading_config.source for c in config.llm_configs}
        self.created = int(time.time())
        self.auth = ApiKeys(config.api_keys)
        self.batches = BatchAPI(
            config.storage_uri,
            serve.get_replica_context().app_name,
            {model_id: replica_name(model_id) for model_id in replicas},
            FileLimits(config.max_file_bytes, config.max_file_lines),
            BatchLimits(config.batch_concurrency, config.max_batch_line_bytes, config.max_file_lines),
        )

    # --- models and health -----------------------------------------------------

    @app.get("/v1/models")
    async def list_models(self, request: Request):
        self.auth.owner(request)
        return {"object": "list", "data": [self._model_card(m) for m in self.replicas]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(self, model_id: str, request: Request):
        self.auth.owner(request)
        self._handle(model_id)
        return self._model_card(model_id)

    def _model_card(self, model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "rayllm-engine",
                "root": self.sources[model_id]}

    @app.get("/metrics")
    async def metrics(self, request: Request):
        self.auth.owner(request)
        return PlainTextResponse(await asyncio.to_thread(node_metrics_text), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health(self):
        """Every model asked at once (one 5 s budget in all); the first unhealthy one, in config order, is named."""
        problems = await asyncio.gather(*(_health_problem(handle) for handle in self.replicas.values()))
        for model_id, problem in zip(self.replicas, problems):
            if problem is not None:
                return JSONResponse(error_body(503, f"model {model_id}: {problem}"), status_code=503)
        return {"status": "ok"}

    # --- generation ------------------------------------------------------------

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request):
        return await self._relay(request, ChatCompletionRequest, "chat")

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(self, request: Request):
        return await self._relay(request, CompletionRequest, "completions")

    @app.post("/generate", openapi_extra=json_body(GenerateRequest))
    async def generate(self, request: Request):
        return await self._relay(request, GenerateRequest, "generate")

    async def _relay(self, request: Request, model: type[BaseModel], method: str):
        self.auth.owner(request)
        body = await self._parse(request, model)
        handle = self._handle(body.model)
        if not body.stream:
            status, reply = await getattr(handle, method).remote(body)
            return JSONResponse(reply, status_code=status)
        stream = getattr(handle.options(stream=True), f"{method}_stream").remote(body)
        first = await stream.__anext__()
        if isinstance(first, dict):  # rejected before streaming
            stream.cancel()
            return JSONResponse(first["body"], status_code=first["status"])
        return StreamingResponse(_relay_stream(first, stream), media_type="text/event-stream")

    # --- files -----------------------------------------------------------------

    @app.post("/v1/files", openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
            "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}}}}}}})
    async def upload_file(self, request: Request):
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            raise OpenAIError(400, "expected a multipart/form-data upload with fields file and purpose")
        owner = self.auth.owner(request)
        form = await request.form(max_part_size=self.config.max_file_bytes)
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str):
            raise OpenAIError(400, "file: a file part is required", "file")
        if not isinstance(purpose, str):
            raise OpenAIError(400, "purpose: required", "purpose")
        return await self.batches.upload(upload, purpose, owner)

    @app.get("/v1/files")
    async def list_files(self, request: Request, purpose: str | None = None, after: str | None = None,
                         limit: int = 10000, order: str = "desc"):
        owner = self.auth.owner(request)
        return await self.batches.list_files(purpose, after, _limit(limit, 10000), _order(order), owner)

    @app.get("/v1/files/{file_id}")
    async def get_file(self, file_id: str, request: Request):
        return await self.batches.get_file(file_id, self.auth.owner(request))

    @app.get("/v1/files/{file_id}/content")
    async def file_content(self, file_id: str, request: Request):
        content = await self.batches.file_content(file_id, self.auth.owner(request))
        return StreamingResponse(content, media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}")
    async def delete_file(self, file_id: str, request: Request):
        return await self.batches.delete_file(file_id, self.auth.owner(request))

    # --- batches ---------------------------------------------------------------

    @app.post("/v1/batches", openapi_extra=json_body(BatchCreateRequest))
    async def create_batch(self, request: Request):
        owner = self.auth.owner(request)
        body = await self._parse(request, BatchCreateRequest)
        return await self.batches.call("create", body.input_file_id, body.endpoint, body.completion_window,
                                       body.metadata, owner)

    @app.get("/v1/batches")
    async def list_batches(self, request: Request, after: str | None = None, limit: int = 20):
        return await self.batches.call("list", after, _limit(limit, 100), self.auth.owner(request))

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(self, batch_id: str, request: Request):
        return await self.batches.call("retrieve", batch_id, self.auth.owner(request))

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, batch_id: str, request: Request):
        return await self.batches.call("cancel", batch_id, self.auth.owner(request))

    # --- helpers ---------------------------------------------------------------

    async def _parse(self, request: Request, model: type[BaseModel]) -> BaseModel:
        if "application/json" not in request.headers.get("content-type", ""):
            raise OpenAIError(400, "expected a JSON body with Content-Type: application/json")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.config.max_request_bytes:
            raise OpenAIError(413, f"request body is over {self.config.max_request_bytes} bytes")
        raw = await request.body()
        if len(raw) > self.config.max_request_bytes:
            raise OpenAIError(413, f"request body is over {self.config.max_request_bytes} bytes")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as e:
            raise from_validation_error(e) from None

    def _handle(self, model_id: str | None) -> DeploymentHandle:
        if model_id is None:
            if len(self.replicas) == 1:
                return next(iter(self.replicas.values()))
            raise OpenAIError(400, f"model: required when serving several models: {sorted(self.replicas)}", "model")
        handle = self.replicas.get(model_id)
        if handle is None:
            raise OpenAIError(404, f"The model `{model_id}` does not exist.", "model", "model_not_found")
        return handle
