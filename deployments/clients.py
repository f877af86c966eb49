"""How the HTTP routes reach a model: one typed interface, two implementations.

This is the only interface that crosses a Ray hop: the HTTP routes and the
batch manager reach a model through it, and nothing else of a replica.
`ModelClient` is what they call: chat, completions and /generate, each as one
reply or a stream of chunks (dicts, serialised to SSE only at the HTTP edge:
http/sse.py); embeddings and the other pooling routes; /tokenize and /detokenize; a health probe. `LLMServer` (the
replica) implements it in-process, which is what direct streaming uses; `RemoteModel` implements it
over a Serve handle to the model's replicas, which is what the ingress and the
batch manager use; a request it sends carries the current trace context
(deployments/tracing.py). Errors are `OpenAIError`s, raised by a call or by a stream
before its first chunk; once a stream has started, an error is its last item,
a `StreamError`.
"""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.completions.protocol import CompletionRequest
from deployments.api.embeddings.protocol import EmbeddingRequest
from deployments.api.generate.protocol import GenerateRequest
from deployments.api.scores.protocol import PoolingCall
from deployments.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from deployments.broadcast import on_every_replica
from deployments.errors import ENGINE_DEAD, OpenAIError, StreamError, remote_errors
from deployments.tracing import carry

logger = logging.getLogger("ray.serve")


class ModelClient(Protocol):
    """`owner` (an API key's digest; None: anonymous) is who the engine shares its seats fairly among;
    `priority` orders online (0) before batch work."""

    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0,
                   owner: str | None = None) -> dict: ...

    async def completions(self, req: CompletionRequest, request_id: str | None = None, priority: int = 0,
                          owner: str | None = None) -> dict: ...

    async def generate(self, req: GenerateRequest, owner: str | None = None) -> dict | list: ...

    async def embeddings(self, req: EmbeddingRequest, request_id: str | None = None, priority: int = 0,
                         owner: str | None = None) -> dict: ...

    async def pooling(self, req: PoolingCall, request_id: str | None = None, priority: int = 0,
                      owner: str | None = None) -> dict:
        """/pooling, /score, /rerank or /classify, as the body's type says."""
        ...

    async def tokenize(self, req: TokenizeRequest) -> dict: ...

    async def detokenize(self, req: DetokenizeRequest) -> dict: ...

    def chat_stream(self, req: ChatCompletionRequest, owner: str | None = None
                    ) -> AsyncIterator[dict | StreamError]: ...

    def completions_stream(self, req: CompletionRequest, owner: str | None = None
                           ) -> AsyncIterator[dict | StreamError]: ...

    def generate_stream(self, req: GenerateRequest, owner: str | None = None) -> AsyncIterator[dict | StreamError]: ...

    async def healthy(self) -> bool: ...

    async def max_model_len(self) -> int: ...

    async def quantization(self) -> str | None: ...

    async def architecture(self) -> str: ...

    async def on_every_replica(self, method: str, *args) -> list:
        """`method(*args)` on every replica of the model (`LLMServer.lifecycle` or `lifecycle_state`: the engine
        lifecycle's admin routes); each one's result."""
        ...


class RemoteModel:
    """A model served by its own deployment: every call and streamed chunk crosses to one of its replicas.

    A replica that dies (its node lost, its process killed), or whose engine dies (a lost tensor- or
    pipeline-parallel rank), before a request has returned anything is retried once on another replica, which
    Serve picks: generating has no side effect, and the client has seen nothing yet. A stream cut after its
    first chunk ends with a `StreamError`; the client decides whether to ask again.
    """

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self.streaming = handle.options(stream=True)

    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0,
                   owner: str | None = None) -> dict:
        carry(req)
        return await _reply(lambda: self.handle.chat.remote(req, request_id, priority, owner))

    async def completions(self, req: CompletionRequest, request_id: str | None = None, priority: int = 0,
                          owner: str | None = None) -> dict:
        carry(req)
        return await _reply(lambda: self.handle.completions.remote(req, request_id, priority, owner))

    async def prefill(self, req: ChatCompletionRequest | CompletionRequest, method: str) -> None:
        """A prefill replica's part of a disaggregated request (deployments/disaggregated.py), routed by its prompt
        as the decode replica's is."""
        carry(req)
        await _reply(lambda: self.handle.prefill.remote(req, method))

    async def generate(self, req: GenerateRequest, owner: str | None = None) -> dict | list:
        carry(req)
        return await _reply(lambda: self.handle.generate.remote(req, owner))

    async def embeddings(self, req: EmbeddingRequest, request_id: str | None = None, priority: int = 0,
                         owner: str | None = None) -> dict:
        carry(req)
        return await _reply(lambda: self.handle.embeddings.remote(req, request_id, priority, owner))

    async def pooling(self, req: PoolingCall, request_id: str | None = None, priority: int = 0,
                      owner: str | None = None) -> dict:
        carry(req)
        return await _reply(lambda: self.handle.pooling.remote(req, request_id, priority, owner))

    async def answer_lines(self, lines: list[tuple[object, str]], priority: int
                           ) -> AsyncIterator[list[tuple[int, int, dict]]]:
        """Batch lines, (request body, request id) each, in one streaming call: (index, HTTP status, body) of
        the lines done, as they finish. A lost replica raises (the batch retries the lines left)."""
        responses = self.streaming.answer_lines.remote(lines, priority)
        finished = False
        try:
            with remote_errors():
                async for answers in responses:
                    yield answers
            finished = True
        finally:
            if not finished:  # left early (the manager stopping) or lost: the replica's lines stop
                responses.cancel()

    async def tokenize(self, req: TokenizeRequest) -> dict:
        return await _reply(lambda: self.handle.tokenize.remote(req))

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        return await _reply(lambda: self.handle.detokenize.remote(req))

    def chat_stream(self, req: ChatCompletionRequest, owner: str | None = None) -> AsyncIterator[dict | StreamError]:
        carry(req)
        return _stream(lambda: self.streaming.chat_stream.remote(req, owner))

    def completions_stream(self, req: CompletionRequest, owner: str | None = None
                           ) -> AsyncIterator[dict | StreamError]:
        carry(req)
        return _stream(lambda: self.streaming.completions_stream.remote(req, owner))

    def generate_stream(self, req: GenerateRequest, owner: str | None = None) -> AsyncIterator[dict | StreamError]:
        carry(req)
        return _stream(lambda: self.streaming.generate_stream.remote(req, owner))

    async def healthy(self) -> bool:
        return await self.handle.healthy.remote()

    async def max_model_len(self) -> int:
        return await self.handle.max_model_len.remote()

    async def quantization(self) -> str | None:
        return await self.handle.quantization.remote()

    async def architecture(self) -> str:
        return await self.handle.architecture.remote()

    async def on_every_replica(self, method: str, *args) -> list:
        return await on_every_replica(self.handle, method, *args)


# What a replica's death looks like through a handle
_REPLICA_LOST = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)
_LOST_MESSAGE = "the model replica serving this request was lost (its node or process died); retry the request"


async def _reply(send: Callable[[], Awaitable]):
    """`send()`'s reply; once more on another replica if the first one is lost, then a 503."""
    for attempt in (0, 1):
        try:
            with remote_errors():
                return await send()
        except _REPLICA_LOST as e:
            logger.warning("replica lost (attempt %d): %r", attempt + 1, e)
        except OpenAIError as e:
            if e.code != ENGINE_DEAD:
                raise
            logger.warning("replica's engine died (attempt %d): %s", attempt + 1, e.message)
    raise OpenAIError(503, _LOST_MESSAGE)


async def _stream(send: Callable[[], DeploymentResponseGenerator]) -> AsyncIterator[dict | StreamError]:
    """A replica's chunks. Lost (or its engine dead) before the first chunk: asked once more. Lost after: a
    `StreamError` ends the stream."""
    started = False
    for attempt in (0, 1):
        responses = send()
        finished = False
        try:
            with remote_errors():
                async for chunk in responses:
                    started = True
                    yield chunk
            finished = True
            return
        except _REPLICA_LOST as e:
            finished = True  # nothing left to cancel
            logger.warning("replica lost mid-stream (attempt %d, started=%s): %r", attempt + 1, started, e)
            if started:
                yield StreamError(503, _LOST_MESSAGE)
                return
        except Exception as e:  # any other failure of the hop, once the client has chunks: in-band, in shape
            if not started and isinstance(e, OpenAIError) and e.code == ENGINE_DEAD:
                finished = True
                logger.warning("replica's engine died before the stream started (attempt %d): %s", attempt + 1,
                               e.message)
                continue
            if not started:
                raise
            logger.exception("stream relay failed")
            yield StreamError(500, f"the stream failed: {type(e).__name__}")
            return
        finally:
            if not finished:  # closed early (a rejection, a client gone): stop the replica's stream and request
                responses.cancel()
    raise OpenAIError(503, _LOST_MESSAGE)
