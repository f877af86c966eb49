"""How the HTTP routes reach a model: one typed interface, two implementations.

`ModelClient` is what a route calls: chat, completions and /generate, each as
one reply or a stream of SSE strings, and a health probe. `LLMServer` (the
replica) implements it in-process, which is what direct streaming uses;
`RemoteModel` implements it over a Serve handle to the model's replicas,
which is what the ingress and the batch manager use. Errors are
`OpenAIError`s, raised by a call or by a stream before its first chunk; once
a stream has started, an error is an SSE error event in the stream.
"""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import contextmanager
from typing import Protocol

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from deployments.errors import OpenAIError, error_body
from deployments.generate_protocol import GenerateRequest
from deployments.protocol import ChatCompletionRequest, CompletionRequest
from deployments.streams import SSE_DONE, sse

logger = logging.getLogger("ray.serve")


class ModelClient(Protocol):
    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0) -> dict: ...

    async def completions(self, req: CompletionRequest, request_id: str | None = None,
                          priority: int = 0) -> dict: ...

    async def generate(self, req: GenerateRequest) -> dict | list: ...

    def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[str]: ...

    def completions_stream(self, req: CompletionRequest) -> AsyncIterator[str]: ...

    def generate_stream(self, req: GenerateRequest) -> AsyncIterator[str]: ...

    async def healthy(self) -> bool: ...

    async def max_model_len(self) -> int: ...


class RemoteModel:
    """A model served by its own deployment: every call and streamed chunk crosses to one of its replicas.

    A replica that dies (its node lost, its process killed) before a request has returned anything is
    retried once on another replica, which Serve picks: generating has no side effect, and the client has
    seen nothing yet. A stream cut after its first chunk ends with an error event and `[DONE]`, in OpenAI's
    shape; the client decides whether to ask again.
    """

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self.streaming = handle.options(stream=True)

    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0) -> dict:
        return await _call(lambda: self.handle.chat.remote(req, request_id, priority))

    async def completions(self, req: CompletionRequest, request_id: str | None = None, priority: int = 0) -> dict:
        return await _call(lambda: self.handle.completions.remote(req, request_id, priority))

    async def generate(self, req: GenerateRequest) -> dict | list:
        return await _call(lambda: self.handle.generate.remote(req))

    def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[str]:
        return _relay(lambda: self.streaming.chat_stream.remote(req))

    def completions_stream(self, req: CompletionRequest) -> AsyncIterator[str]:
        return _relay(lambda: self.streaming.completions_stream.remote(req))

    def generate_stream(self, req: GenerateRequest) -> AsyncIterator[str]:
        return _relay(lambda: self.streaming.generate_stream.remote(req))

    async def healthy(self) -> bool:
        return await self.handle.healthy.remote()

    async def max_model_len(self) -> int:
        return await self.handle.max_model_len.remote()


# What a replica's death looks like through a handle
_REPLICA_LOST = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)
_LOST_MESSAGE = "the model replica serving this request was lost (its node or process died); retry the request"


@contextmanager
def _replica_errors():
    """Re-raise a replica's `OpenAIError` as itself (Ray wraps what a replica raises in a RayTaskError)."""
    try:
        yield
    except RayTaskError as e:
        if isinstance(e.cause, OpenAIError):
            raise e.cause from None
        raise


async def _call(send: Callable[[], Awaitable]):
    """`send()`'s reply; once more on another replica if the first one is lost, then a 503."""
    for attempt in (0, 1):
        try:
            with _replica_errors():
                return await send()
        except _REPLICA_LOST as e:
            logger.warning("replica lost (attempt %d): %r", attempt + 1, e)
    raise OpenAIError(503, _LOST_MESSAGE)


async def _relay(send: Callable[[], DeploymentResponseGenerator]) -> AsyncIterator[str]:
    """A replica's SSE chunks. Lost before the first chunk: asked once more. Lost after: an error event and
    `[DONE]` end the stream."""
    started = False
    for attempt in (0, 1):
        responses = send()
        finished = False
        try:
            with _replica_errors():
                async for chunk in responses:
                    started = True
                    yield chunk
            finished = True
            return
        except _REPLICA_LOST as e:
            finished = True  # nothing left to cancel
            logger.warning("replica lost mid-stream (attempt %d, started=%s): %r", attempt + 1, started, e)
            if started:
                yield sse(error_body(503, _LOST_MESSAGE))
                yield SSE_DONE
                return
        except Exception as e:  # any other failure of the hop, once the client has chunks: in-band, in shape
            if not started:
                raise
            logger.exception("stream relay failed")
            yield sse(error_body(500, f"the stream failed: {type(e).__name__}"))
            yield SSE_DONE
            return
        finally:
            if not finished:  # closed early (a rejection, a client gone): stop the replica's stream and request
                responses.cancel()
    raise OpenAIError(503, _LOST_MESSAGE)
