"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from contextlib import contextmanager
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray.exceptions import RayTaskError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout",
    413: "invalid_request_error",
    429: "requests",  # OpenAI's type for a bound on requests
    431: "invalid_request_error",
    503: "service_unavailable_error",
}


# the code of a replica's 503 when its engine died before the request returned anything: to the ingress, that
# replica is lost, and the request is asked of another (deployments/clients.py)
ENGINE_DEAD = "engine_dead"


class OpenAIError(Exception):
    """`overflow`: (prompt tokens, max_tokens or None, context length) of a request over the model's context,
    for APIs whose clients read the numbers back (Anthropic's)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 overflow: tuple[int, int | None, int] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.overflow = overflow

    def __reduce__(self):  # crosses Ray process boundaries intact
        return OpenAIError, (self.status, self.message, self.param, self.code, self.overflow)

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model[:200]}` does not exist.", "model", "model_not_found")


@dataclass(frozen=True)
class StreamError:
    """An error after a stream's first chunk. It is the stream's last item; the HTTP edge sends it as OpenAI's
    in-band `data: {"error": ...}` event before `[DONE]` (the status line was sent with the first chunk)."""

    status: int
    message: str
    param: str | None = None

    @classmethod
    def of(cls, e: OpenAIError) -> "StreamError":
        return cls(e.status, e.message, e.param)

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@contextmanager
def remote_errors():
    """Re-raise an `OpenAIError` raised in another process as itself (Ray wraps what an actor or a replica
    raises in a RayTaskError)."""
    try:
        yield
    except RayTaskError as e:
        if isinstance(e.cause, OpenAIError):
            raise e.cause from None
        raise


def field_path(loc: tuple) -> str:
    """A pydantic error location as a dotted field path (`messages.0.role`)."""
    return ".".join(str(p) for p in loc)


def from_validation_error(e: ValidationError) -> OpenAIError:
    """A 400 naming the first offending field, with every problem in the message."""
    errors = e.errors()
    problems = []
    for err in errors:
        loc = field_path(err["loc"])
        problems.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    param = field_path(errors[0]["loc"]) if errors else ""
    return OpenAIError(400, "; ".join(problems), param=param or None)
