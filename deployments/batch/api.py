"""The Files and Batches routes' work, on the ingress side.

File bytes stream straight between the client and the object store; batch
calls go to the batch manager actor, which is created on first use and
re-created if it has died (it then resumes every unfinished batch).
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import ray
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayError

from deployments.batch.files import FileLimits, FileStore
from deployments.batch.job import BatchLimits
from deployments.batch.manager import BatchManager
from deployments.errors import OpenAIError, remote_errors
from deployments.storage import open_store

logger = logging.getLogger("ray.serve")
NAMESPACE = "rayllm"
# The manager's Serve handles route in its own event loop, not a second thread's (what Serve's throughput-optimized
# mode sets): its CPU per batch line is mostly the handle's routing, and this saves a thread hop per line
_MANAGER_ENV = {"RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


class BatchAPI:
    def __init__(self, storage_uri: str, app_name: str, deployments: dict[str, str], file_limits: FileLimits,
                 limits: BatchLimits):
        self.files = FileStore(open_store(storage_uri), file_limits)
        self._manager_args = (storage_uri, app_name, deployments, file_limits, limits)
        self._manager_name = f"batch-manager-{app_name}"
        self._manager = None

    # --- files -----------------------------------------------------------------

    async def upload(self, upload, purpose: str, owner: str | None) -> dict:
        source = upload.file
        chunks = iter(lambda: source.read(1 << 20), b"")
        name = upload.filename or "upload.jsonl"
        return await asyncio.to_thread(self.files.create, name, purpose, chunks, None, owner, True)

    async def get_file(self, file_id: str, owner: str | None) -> dict:
        return await asyncio.to_thread(self.files.get, file_id, owner)

    async def list_files(self, purpose: str | None, after: str | None, limit: int, order: str,
                         owner: str | None) -> dict:
        return await asyncio.to_thread(self.files.list, purpose, after, limit, order, owner)

    async def delete_file(self, file_id: str, owner: str | None) -> dict:
        return await asyncio.to_thread(self.files.delete, file_id, owner)

    async def image_bytes(self, file_id: str, owner: str | None, max_bytes: int, param: str) -> bytes:
        """An uploaded picture's bytes (a Responses `input_image` by `file_id`): a missing or foreign file, or one
        over `max_bytes`, is a 400 naming `param`, refused before it is read."""
        try:
            meta = await self.get_file(file_id, owner)
        except OpenAIError:
            raise OpenAIError(400, f"{param}: no file with id {file_id!r}", param) from None
        if meta["bytes"] > max_bytes:
            raise OpenAIError(400, f"{param}: the image is over the {max_bytes} bytes allowed", param)
        return b"".join([chunk async for chunk in await self.file_content(file_id, owner)])

    async def file_content(self, file_id: str, owner: str | None) -> AsyncIterator[bytes]:
        """The file's bytes as a stream; a missing or foreign file raises its 404 here, before streaming."""
        chunks = await asyncio.to_thread(self.files.content, file_id, owner)

        async def stream() -> AsyncIterator[bytes]:
            while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                yield chunk

        return stream()

    # --- batches ---------------------------------------------------------------

    async def create(self, input_file_id: str, endpoint: str, completion_window: str, metadata: dict | None,
                     owner: str | None) -> dict:
        return await self._call(lambda m: m.create.remote(input_file_id, endpoint, completion_window, metadata, owner))

    async def list(self, after: str | None, limit: int, owner: str | None) -> dict:
        return await self._call(lambda m: m.list.remote(after, limit, owner))

    async def retrieve(self, batch_id: str, owner: str | None) -> dict:
        return await self._call(lambda m: m.retrieve.remote(batch_id, owner))

    async def cancel(self, batch_id: str, owner: str | None) -> dict:
        return await self._call(lambda m: m.cancel.remote(batch_id, owner))

    async def _call(self, send: Callable[[ActorHandle], ObjectRef]):
        """`send` to the manager; a dead manager is re-created once, and its OpenAI errors re-raised here."""
        for attempt in (0, 1):
            manager = self._manager or self._get_or_create()
            try:
                with remote_errors():
                    return await send(manager)
            except (ActorDiedError, ActorUnavailableError):
                self._manager = None
                if attempt:
                    raise OpenAIError(503, "the batch manager is restarting; try again") from None

    def start_manager(self, timeout_s: float = 120) -> None:
        """Create the batch manager now and wait until it answers (its process started, its batches resumed), so
        the app is ready for a batch when it says ready; one that does not answer in time goes on starting, and
        the first Batches call waits for it (or makes it again, if it died)."""
        try:
            ray.get(self._get_or_create().list.remote(None, 1, None), timeout=timeout_s)
        except (GetTimeoutError, OpenAIError, RayError) as e:
            logger.warning("the batch manager did not answer at start: %r", e)

    def _get_or_create(self):
        self._manager = BatchManager.options(
            name=self._manager_name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0, max_concurrency=1000, runtime_env={"env_vars": _MANAGER_ENV},
        ).remote(*self._manager_args)
        return self._manager
