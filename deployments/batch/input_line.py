"""Validation of one line of a batch input file into a request for a replica."""

from dataclasses import dataclass

from pydantic import ValidationError

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.completions.protocol import CompletionRequest
from deployments.api.embeddings.protocol import EmbeddingRequest
from deployments.api.scores.protocol import RerankRequest, ScoreRequest
from deployments.api.strict_json import loads_object
from deployments.errors import from_validation_error
from deployments.replica.adapters import adapter_name

# vLLM's batch runner takes /v1/score and /v1/rerank lines too
ENDPOINTS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
             "/v1/embeddings": EmbeddingRequest, "/v1/score": ScoreRequest, "/v1/rerank": RerankRequest}


class LineError(ValueError):
    """A bad input line: it goes to the error file with its line number; the batch goes on."""

    def __init__(self, message: str, custom_id: str | None = None):
        super().__init__(message)
        self.custom_id = custom_id


@dataclass
class BatchRequest:
    custom_id: str
    model: str  # the served model whose replicas run it
    body: ChatCompletionRequest | CompletionRequest | EmbeddingRequest | ScoreRequest | RerankRequest


def parse_line(raw: bytes, endpoint: str, models: set[str], seen: set[str], max_bytes: int) -> BatchRequest:
    """Parse and check one line; records its custom_id in `seen`. Raises LineError."""
    if len(raw) > max_bytes:
        raise LineError(f"the line is over the {max_bytes}-byte limit")
    try:
        item = loads_object(raw)
    except ValueError as e:
        raise LineError(f"each line must be a JSON object: {e}") from None
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("custom_id: a non-empty string is required")
    if custom_id in seen:
        raise LineError(f"custom_id: {custom_id!r} appears more than once", custom_id)
    seen.add(custom_id)
    if item.get("method", "POST") != "POST":
        raise LineError(f"method: only POST is supported, got {item.get('method')!r}", custom_id)
    url = item.get("url")
    if not isinstance(url, str) or _normalise(url) != _normalise(endpoint):
        raise LineError(f"url: {url!r} does not match the batch endpoint {endpoint!r}", custom_id)
    body = item.get("body")
    if not isinstance(body, dict):
        raise LineError("body: a JSON object is required", custom_id)
    if body.get("stream"):
        raise LineError("body.stream: streaming is not supported in a batch", custom_id)
    model = body.get("model")
    if model is None and len(models) == 1:
        model = next(iter(models))
    # `<model_id>:<adapter>` runs on the model's replicas, which look the adapter up (a bare adapter name is the
    # ingress's to resolve: not in a batch line)
    base = model if model in models else next((m for m in models if isinstance(model, str) and
                                               model.startswith(m + ":") and adapter_name(model, m)), None)
    if base is None:
        raise LineError(f"body.model: unknown model {model!r}; available: {sorted(models)}", custom_id)
    try:
        request = ENDPOINTS[endpoint].model_validate(body)
    except ValidationError as e:
        raise LineError(f"body.{from_validation_error(e)}", custom_id) from None
    return BatchRequest(custom_id, base, request)


def peek_custom_id(raw: bytes) -> str | None:
    """The custom_id of an already processed line, to rebuild the duplicate check on resume."""
    try:
        item = loads_object(raw)
    except ValueError:
        return None
    custom_id = item.get("custom_id")
    return custom_id if isinstance(custom_id, str) and custom_id else None


def _normalise(url: str) -> str:
    return url[3:] if url.startswith("/v1/") else url
