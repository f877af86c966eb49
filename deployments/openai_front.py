"""What the HTTP routes work with: the app's config, its API keys, its models (and their LoRA adapters), the
batch and Responses APIs, and the parsing of request bodies, which refuses bad input before any engine sees it.
"""

import asyncio
import time

from fastapi import Request
from pydantic import BaseModel, ValidationError
from ray import serve

from deployments.app_config import AppConfig, replica_name
from deployments.auth import ApiKeys
from deployments.batch.api import BatchAPI
from deployments.batch.files import FileLimits
from deployments.batch.job import BatchLimits
from deployments.errors import OpenAIError, from_validation_error
from deployments.lora_adapters import adapter_name, adapters_of, not_found
from deployments.model_clients import ModelClient
from deployments.request_work import off_loop
from deployments.responses.api import ResponsesAPI
from deployments.responses.store import ResponseStore
from deployments.strict_json import loads_object
from runtime.storage import open_store


class OpenAIFront:
    """What the routes work with: the app's config, its API keys, its models and the batch API."""

    def __init__(self, config: AppConfig, models: dict[str, ModelClient]):
        self.config = config
        self.models = models
        self.sources = {c.model_id: c.model_loading_config.source for c in config.llm_configs}
        self.adapters = {c.model_id: adapters_of(c) for c in config.llm_configs}
        self.lora_paths = {c.model_id: c.lora_config.dynamic_lora_loading_path.rstrip("/")
                           for c in config.llm_configs if c.lora_config}
        self.created = int(time.time())
        self._max_model_len: dict[str, int] = {}
        self.auth = ApiKeys(config.api_keys)
        self.batches = BatchAPI(
            config.storage_uri,
            serve.get_replica_context().app_name,
            {model_id: replica_name(model_id) for model_id in models},
            FileLimits(config.max_file_bytes, config.max_file_lines),
            BatchLimits(config.batch_concurrency, config.max_batch_line_bytes, config.max_file_lines),
        )
        self.responses = ResponsesAPI(ResponseStore(open_store(config.storage_uri)))

    async def max_model_len(self, model_id: str) -> int:
        """A model's context length, asked of a replica once."""
        if model_id not in self._max_model_len:
            self._max_model_len[model_id] = await self.models[model_id].max_model_len()
        return self._max_model_len[model_id]

    async def model_card(self, model_id: str) -> dict:
        """OpenAI's model object, with `max_model_len` as vLLM and SGLang give it."""
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "rayllm-engine",
                "root": self.sources[model_id], "max_model_len": await self.max_model_len(model_id)}

    def model(self, model_id: str | None) -> ModelClient:
        return self.models[self.model_id(model_id)]

    def model_id(self, model_id: str | None) -> str:
        """The id of the model a request names (`<model_id>:<adapter>` names the model's LoRA adapter, which its
        replica looks up); the only one served when it names none."""
        if model_id is None:
            if len(self.models) == 1:
                return next(iter(self.models))
            raise OpenAIError(400, f"model: required when serving several models: {sorted(self.models)}", "model")
        if model_id in self.models:
            return model_id
        base = next((m for m in self.models if adapter_name(model_id, m)), None)
        if base is None:
            raise not_found(model_id)
        return base

    async def model_cards(self) -> list[dict]:
        """Every model, then its LoRA adapters (`<model_id>:<adapter>`, parent the model)."""
        cards = []
        for model_id in self.models:
            card = await self.model_card(model_id)
            names = await asyncio.to_thread(self.adapters[model_id].names)
            cards += [card] + [{**card, "id": f"{model_id}:{name}", "parent": model_id,
                                "root": f"{self.lora_paths[model_id]}/{name}"} for name in names]
        return cards

    async def parse(self, request: Request, model: type[BaseModel]) -> BaseModel:
        if "application/json" not in request.headers.get("content-type", ""):
            raise OpenAIError(400, "expected a JSON body with Content-Type: application/json")
        limit = self.config.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise OpenAIError(413, f"request body is over {limit} bytes")
        raw = await request.body()
        if len(raw) > limit:
            raise OpenAIError(413, f"request body is over {limit} bytes")
        # a large body takes up to a second to parse and validate: off the event loop, which other requests
        # share; a small one on it (10 us, against 130 us for the hop to a thread)
        large = len(raw) > _SMALL_BODY_BYTES
        data = await off_loop(_load, raw) if large else _load(raw)
        await self._check_conversation_fits(data)
        known = {name for name, f in model.model_fields.items() for name in (name, f.alias) if name}
        request.state.ignored_fields = sorted(key for key in data if key not in known)
        return await off_loop(_validate, model, data) if large else _validate(model, data)

    async def _check_conversation_fits(self, data: dict) -> None:
        """Refuse a conversation with more turns than its model's context has tokens (every message the chat
        template renders takes at least one), before the work of validating and rendering them all. Reasoning
        items, which are not rendered, do not count."""
        turns = data.get("messages", data.get("input"))
        if not isinstance(turns, list) or len(turns) < _FEW_TURNS or not isinstance(data.get("model"), str | None):
            return
        try:
            model_id = self.model_id(data.get("model"))
        except OpenAIError:
            return  # validation or the route answers for the model
        limit = await self.max_model_len(model_id)
        if len(turns) < limit:
            return
        rendered = sum(1 for t in turns if not (isinstance(t, dict) and t.get("type") == "reasoning"))
        field = "messages" if "messages" in data else "input"
        if rendered >= limit:
            raise OpenAIError(400, f"{field}: {rendered} turns cannot fit this model's maximum context length of "
                                   f"{limit} tokens (each takes at least one token)", field)

    async def generation(self, request: Request, model: type[BaseModel]) -> tuple[BaseModel, ModelClient]:
        """A generation route's parsed body and the client of the model it names."""
        self.auth.owner(request)
        body = await self.parse(request, model)
        return body, self.model(body.model)


_SMALL_BODY_BYTES = 64 * 1024
_FEW_TURNS = 256  # cheap to validate and render whatever the context: not worth asking a replica its length


def _load(raw: bytes) -> dict:
    try:
        return loads_object(raw)
    except ValueError as e:
        raise OpenAIError(400, f"the body: {e}") from None


def _validate(model: type[BaseModel], data: dict) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e) from None
