"""How the HTTP routes reach a model: one typed interface, two implementations.

`ModelClient` is what a route calls: chat, completions and /generate, each as
one reply or a stream of SSE strings, and a health probe. `LLMServer` (the
replica) implements it in-process, which is what direct streaming uses;
`RemoteModel` implements it over a Serve handle to the model's replicas,
which is what the ingress and the batch manager use. Errors are
`OpenAIError`s, raised by a call or by a stream before its first chunk; once
a stream has started, an error is an SSE error event in the stream.
"""

from collections.abc import AsyncIterator
from contextlib import contextmanager
from typing import Protocol

from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from deployments.errors import OpenAIError
from deployments.generate_protocol import GenerateRequest
from deployments.protocol import ChatCompletionRequest, CompletionRequest


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
    """A model served by its own deployment: every call and streamed chunk crosses to one of its replicas."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self.streaming = handle.options(stream=True)

    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0) -> dict:
        with _replica_errors():
            return await self.handle.chat.remote(req, request_id, priority)

    async def completions(self, req: CompletionRequest, request_id: str | None = None, priority: int = 0) -> dict:
        with _replica_errors():
            return await self.handle.completions.remote(req, request_id, priority)

    async def generate(self, req: GenerateRequest) -> dict | list:
        with _replica_errors():
            return await self.handle.generate.remote(req)

    def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[str]:
        return _relay(self.streaming.chat_stream.remote(req))

    def completions_stream(self, req: CompletionRequest) -> AsyncIterator[str]:
        return _relay(self.streaming.completions_stream.remote(req))

    def generate_stream(self, req: GenerateRequest) -> AsyncIterator[str]:
        return _relay(self.streaming.generate_stream.remote(req))

    async def healthy(self) -> bool:
        return await self.handle.healthy.remote()

    async def max_model_len(self) -> int:
        return await self.handle.max_model_len.remote()


@contextmanager
def _replica_errors():
    """Re-raise a replica's `OpenAIError` as itself (Ray wraps what a replica raises in a RayTaskError)."""
    try:
        yield
    except RayTaskError as e:
        if isinstance(e.cause, OpenAIError):
            raise e.cause from None
        raise


async def _relay(responses: DeploymentResponseGenerator) -> AsyncIterator[str]:
    finished = False
    try:
        with _replica_errors():
            async for chunk in responses:
                yield chunk
        finished = True
    finally:
        if not finished:  # closed early (a rejection, a client gone): stop the replica's stream and request
            responses.cancel()
