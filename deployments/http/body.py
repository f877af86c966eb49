"""Request bodies, read and validated on the HTTP side so bad input never reaches an engine.

The stages a body passes before an engine sees it, each refusing with an `OpenAIError` (400 unless said):

| stage | where | refuses |
|---|---|---|
| content type, size (413) | `BodyParser.parse` | anything but JSON; a body over `max_request_bytes` |
| strict JSON | api/strict_json.py | bad UTF-8, NaN, lone surrogates, deep nesting |
| turn count | `BodyParser._check_conversation_fits` | more turns than the model's context has tokens |
| fields | the request's pydantic model (api/<api>/protocol.py) | a known field with a wrong type or value |
| tokens | the replica: a handler's `_prepare`, `engine.validate` | a prompt over the context, ids out of vocab |
| grammar | the replica: `engine.compile` | a schema, regex or grammar that does not compile in time |
"""

from fastapi import Request
from pydantic import BaseModel, ValidationError

from deployments.api.strict_json import loads_object
from deployments.errors import OpenAIError, from_validation_error
from deployments.http.models import ModelRegistry
from deployments.work_pool import off_loop

_SMALL_BODY_BYTES = 64 * 1024
_FEW_TURNS = 256  # cheap to validate and render whatever the context: not worth asking a replica its length


class BodyParser:
    def __init__(self, models: ModelRegistry, max_request_bytes: int):
        self.models = models
        self.limit = max_request_bytes

    async def parse(self, request: Request, model: type[BaseModel]) -> BaseModel:
        if "application/json" not in request.headers.get("content-type", ""):
            raise OpenAIError(400, "expected a JSON body with Content-Type: application/json")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.limit:
            raise OpenAIError(413, f"request body is over {self.limit} bytes")
        raw = await request.body()
        if len(raw) > self.limit:
            raise OpenAIError(413, f"request body is over {self.limit} bytes")
        # a large body takes up to a second to parse and validate: off the event loop, which other requests
        # share; a small one on it (parsing it costs less than the hop to a thread)
        large = len(raw) > _SMALL_BODY_BYTES
        data = await off_loop(_load, raw) if large else _load(raw)
        await self.models.find(data.get("model"))
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
            model_id = self.models.model_id(data.get("model"))
        except OpenAIError:
            return  # validation or the route answers for the model
        limit = await self.models.max_model_len(model_id)
        if len(turns) < limit:
            return
        rendered = sum(1 for t in turns if not (isinstance(t, dict) and t.get("type") == "reasoning"))
        field = "messages" if "messages" in data else "input"
        if rendered >= limit:
            raise OpenAIError(400, f"{field}: {rendered} turns cannot fit this model's maximum context length of "
                                   f"{limit} tokens (each takes at least one token)", field, "context_length_exceeded",
                              (rendered, None, limit))


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
