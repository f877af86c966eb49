"""The batch manager: a detached, named Ray actor that owns the Batches API's state.

Every batch's object lives in the store (`batches/<id>/state.json`); as soon
as it starts (or Ray restarts it), the manager loads the unfinished ones and
resumes them, so a restarted actor, or a new cluster pointed at the same
storage, loses nothing and needs no API call to go on. Only unfinished
batches are held in memory; a finished one is read from the store when asked
for, and lists page through the store's index (index.py). Requests
go to the model replicas through Serve handles at batch priority, so online
traffic is admitted first. Each model's handle is made once, and the lines
started together share a call (line_groups.py); its lines in flight, across
all batches, follow its running replicas (capacity.py).
"""

import asyncio
import logging
import threading
import time

import ray
from ray import serve

from deployments.api.batches.protocol import window_seconds
from deployments.api.pagination import list_page
from deployments.batch.capacity import Capacity, running_replicas
from deployments.batch.files import FileLimits, FileStore
from deployments.batch.index import BatchIndex
from deployments.batch.input_line import ENDPOINTS, BatchRequest
from deployments.batch.job import BatchJob, BatchLimits
from deployments.batch.line_groups import LineGroups
from deployments.batch.state import TERMINAL, Batch, BatchState, new_batch
from deployments.clients import RemoteModel
from deployments.errors import OpenAIError
from deployments.storage import StoreError, open_s3_object, open_store
from runtime.engine.startup_heap import freeze_startup_heap

logger = logging.getLogger(__name__)

BATCH_PRIORITY = 1 << 32  # a batch line's tier, above any online request's own priority (lower goes first)
_REPLICAS_EVERY_S = 5.0  # how often each model's running replicas are read from Serve


@ray.remote(max_restarts=-1)
class BatchManager:
    def __init__(self, storage_uri: str, app_name: str, deployments: dict[str, str], file_limits: FileLimits,
                 limits: BatchLimits):
        self.store = open_store(storage_uri)
        self.files = FileStore(self.store, file_limits)
        self.index = BatchIndex(self.store)
        self.app_name = app_name
        self.deployments = deployments  # model id -> replica deployment name
        self.limits = limits
        self.jobs: dict[str, BatchJob] = {}  # the unfinished batches
        self.tasks: dict[str, asyncio.Task] = {}
        self._loading: asyncio.Task | None = None
        self._groups: dict[str, LineGroups] = {}
        self._models: dict[str, RemoteModel] = {}
        self._capacity = {model: Capacity(limits.per_replica(model)) for model in deployments}
        self._watching: asyncio.Task | None = None
        # resume at once, on first start and on every restart by Ray, not on the first API call: a batch
        # nobody polls still finishes. The call to itself runs once __init__ returns; it is made from a thread
        # and repeated until answered, because a call made while Ray restarts the actor can fail or be lost
        # (CI saw a restarted manager that never resumed). Resuming twice is harmless: the load runs once.
        threading.Thread(target=_call_until_answered, args=(ray.get_runtime_context().current_actor,),
                         name="resume", daemon=True).start()
        freeze_startup_heap()

    async def resume(self) -> None:
        """Restart the unfinished batches, retrying while the storage is unreachable."""
        delay = 1.0
        while True:
            try:
                return await self._resume()
            except StoreError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30)

    async def _resume(self) -> None:
        """Load the unfinished batches from the store and restart them, once per actor life.

        Calls that arrive while the load runs wait for it rather than answer from a partial set; a load
        that failed (storage unreachable) is tried again by the next call.
        """
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())
        loading = self._loading
        try:
            await asyncio.shield(loading)
        except StoreError:
            if self._loading is loading:
                self._loading = None
            raise

    async def _load(self) -> None:
        for state in await asyncio.to_thread(self.index.unfinished):
            if state.batch.id not in self.jobs:  # else loaded by an earlier, interrupted attempt
                self._start(self._job(state))
        for model_id in self.deployments:
            asyncio.get_running_loop().create_task(self._reach(model_id))

    async def _reach(self, model_id: str) -> None:
        """A handle's first call waits for Serve to name the model's replicas: made at start, not by a line."""
        try:
            await self._model(model_id).healthy()
        except Exception as e:  # not up yet: the first line's call waits instead
            logger.info("batch manager: model %s not reached at start: %r", model_id, e)

    def _job(self, state: BatchState) -> BatchJob:
        job = BatchJob(state, self.store, self.files, set(self.deployments), self._send, self.limits,
                       self._capacity.__getitem__)
        self.jobs[job.id] = job
        return job

    def _start(self, job: BatchJob) -> None:
        loop = asyncio.get_running_loop()
        self.tasks[job.id] = loop.create_task(self._run(job))
        if self._watching is None:
            self._watching = loop.create_task(self._follow_replicas())

    async def _follow_replicas(self) -> None:
        """Size each model's capacity to its running replicas, read every few seconds (one, while unknown)."""
        while True:
            try:
                replicas = await asyncio.to_thread(running_replicas, self.app_name, self.deployments)
                for model, count in replicas.items():
                    self._capacity[model].resize(self.limits.per_replica(model) * max(count, 1))
            except Exception as e:  # the controller is restarting: keep the last sizes
                logger.info("batch manager: cannot read the replicas: %r", e)
            await asyncio.sleep(_REPLICAS_EVERY_S)

    async def _run(self, job: BatchJob) -> None:
        """Run a batch to its end, then let it go: its final state saved (again: the last save may have failed
        after the status changed), it is unmarked and read from the store from then on."""
        delay = 1.0
        while True:
            try:
                if job.batch.status not in TERMINAL:
                    await job.run()
                    continue
                await job.save()
                await asyncio.to_thread(self.index.finish, job.id)
                break
            except StoreError:  # storage unreachable: keep the progress saved so far and try again
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30)
        del self.jobs[job.id], self.tasks[job.id]

    async def _send(self, request: BatchRequest, request_id: str) -> tuple[int, dict]:
        """One line's request to its model's replicas, coalesced with the lines started beside it
        (line_groups.py): (HTTP status, body) for the output line."""
        return await self._line_groups(request.model).send(request.body, request_id)

    def _line_groups(self, model_id: str) -> LineGroups:
        groups = self._groups.get(model_id)
        if groups is None:
            model = self._model(model_id)
            groups = self._groups[model_id] = LineGroups(lambda lines: model.answer_lines(lines, BATCH_PRIORITY))
        return groups

    def _model(self, model_id: str) -> RemoteModel:
        model = self._models.get(model_id)
        if model is None:
            handle = serve.get_deployment_handle(self.deployments[model_id], app_name=self.app_name)
            model = self._models[model_id] = RemoteModel(handle)
        return model

    # --- the API ---------------------------------------------------------------

    async def create(self, input_file_id: str, endpoint: str, completion_window: str, metadata: dict | None,
                     owner: str | None = None) -> dict:
        await self._resume()
        if endpoint not in ENDPOINTS:
            raise OpenAIError(400, f"endpoint: expected one of {sorted(ENDPOINTS)}, got {endpoint!r}", "endpoint")
        window = window_seconds(completion_window or "")
        if window is None:
            raise OpenAIError(400, f"completion_window: expected a duration like '24h', got {completion_window!r}",
                              "completion_window")
        if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16):
            raise OpenAIError(400, "metadata: at most 16 string key-value pairs", "metadata")
        active = sum(job.state.progress.owner == owner for job in self.jobs.values())
        if active >= self.limits.max_active_per_key:
            raise OpenAIError(429, f"this API key has {active} unfinished batches, the most it may have; create "
                                   "more as they finish", code="rate_limit_exceeded")
        input_uri = await asyncio.to_thread(self._input_uri, input_file_id, owner)
        job = self._job(new_batch(input_file_id, endpoint, window, completion_window, metadata, input_uri, owner))
        try:
            await asyncio.to_thread(self.index.begin, job.id)
            await job.save()
            await asyncio.to_thread(self.index.add, job.state)
        except BaseException:
            del self.jobs[job.id]
            raise
        self._start(job)
        return job.batch.model_dump()

    def _input_uri(self, input_file_id: str, owner: str | None) -> str:
        if input_file_id.startswith("s3://"):
            store, key = open_s3_object(input_file_id)
            try:
                size = store.size(key) if key else None
            except StoreError as e:
                raise OpenAIError(400, f"input_file_id: cannot read {input_file_id}: {e}", "input_file_id") from e
            if size is None:
                raise OpenAIError(404, f"input_file_id: no object at {input_file_id}", "input_file_id")
            return input_file_id
        meta = self.files.get(input_file_id, owner)
        if meta["purpose"] != "batch":
            raise OpenAIError(400, f"input_file_id: file {input_file_id} has purpose {meta['purpose']!r}, "
                                   "not 'batch'", "input_file_id")
        return FileStore.content_key(input_file_id)

    async def retrieve(self, batch_id: str, owner: str | None = None) -> dict:
        await self._resume()
        return (await self._get(batch_id, owner)).model_dump()

    async def list(self, after: str | None, limit: int, owner: str | None = None) -> dict:
        await self._resume()
        ids, more = await asyncio.to_thread(self.index.page, owner, after, limit)
        batches = await asyncio.gather(*(self._read(batch_id) for batch_id in ids))
        return list_page([state.batch.model_dump() for state in batches if state is not None], more)

    async def cancel(self, batch_id: str, owner: str | None = None) -> dict:
        await self._resume()
        batch = await self._get(batch_id, owner)
        if batch.status in TERMINAL or batch.status == "finalizing":
            raise OpenAIError(400, f"batch {batch_id} is already {batch.status}; it cannot be cancelled")
        job = self.jobs[batch_id]
        job.cancel()
        await job.save()
        return job.batch.model_dump()

    async def _read(self, batch_id: str) -> BatchState | None:
        """An unfinished batch as it runs, a finished one from the store."""
        job = self.jobs.get(batch_id)
        return job.state if job else await asyncio.to_thread(self.index.read, batch_id)

    async def _get(self, batch_id: str, owner: str | None) -> Batch:
        state = await self._read(batch_id)
        if state is None or state.progress.owner != owner:
            raise OpenAIError(404, f"No batch with id {batch_id!r}", "batch_id", "batch_not_found")
        return state.batch


def _call_until_answered(manager) -> None:
    """`manager.resume()`, asked again every 30 s (or 1 s after a failure) until one call returns."""
    while True:
        try:
            ray.get(manager.resume.remote(), timeout=30)
            return
        except ray.exceptions.GetTimeoutError:
            continue
        except Exception as e:  # the actor is not reachable yet
            logger.info("batch manager resume: %r; asking again", e)
            time.sleep(1)
