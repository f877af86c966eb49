"""How the HTTP routes reach a model: through a Serve handle to its replicas (behind the ingress),
or in-process when the model's replica is itself the ingress (direct streaming)."""

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from ray.serve.handle import DeploymentHandle

if TYPE_CHECKING:
    from deployments.llm_server import LLMServer, Reply


class ModelClient(Protocol):
    async def call(self, method: str, body) -> "Reply": ...

    def stream(self, method: str, body) -> AsyncIterator[str | dict]: ...

    async def healthy(self) -> bool: ...


class RemoteModel:
    """A model served by its own deployment: every call and streamed chunk crosses to one of its replicas."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    async def call(self, method: str, body) -> "Reply":
        return await getattr(self.handle, method).remote(body)

    async def stream(self, method: str, body) -> AsyncIterator[str | dict]:
        responses = getattr(self.handle.options(stream=True), f"{method}_stream").remote(body)
        finished = False
        try:
            async for item in responses:
                yield item
            finished = True
        finally:
            if not finished:  # closed early (a rejection, a client gone): stop the replica's stream and request
                responses.cancel()

    async def healthy(self) -> bool:
        return await self.handle.healthy.remote()


class LocalModel:
    """The model this replica serves: calls go straight to its LLMServer methods."""

    def __init__(self, server: "LLMServer"):
        self.server = server

    async def call(self, method: str, body) -> "Reply":
        return await getattr(self.server, method)(body)

    def stream(self, method: str, body) -> AsyncIterator[str | dict]:
        return getattr(self.server, f"{method}_stream")(body)

    async def healthy(self) -> bool:
        return await self.server.healthy()
