"""One batch job: the loop that runs a batch (its state in state.py) to a final status.

The input is streamed line by line and processed in windows of lines. Each
window's requests run concurrently (bounded); its output and error lines are
written as part objects keyed by the window, and only then is the job's
progress saved. A restarted manager resumes at the first unsaved window and
rewrites that window's parts, so no line is lost or written twice. When the
input is done (or the batch is cancelled or expires), the parts are
concatenated into the output and error files.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from deployments.batch.files import FileStore
from deployments.batch.input_line import BatchRequest, LineError, parse_line, peek_custom_id
from deployments.batch.state import TERMINAL, Batch, BatchError, BatchErrors, BatchState, Progress, Status
from deployments.metrics import count_batch
from runtime.storage import MissingObjectError, ObjectStore, StoreError, open_s3_object

logger = logging.getLogger(__name__)

Send = Callable[[BatchRequest, str], Awaitable[tuple[int, dict]]]


class BatchLimits:
    def __init__(self, concurrency: int = 64, max_line_bytes: int = 1 << 20, max_lines: int = 50_000,
                 request_retries: int = 3):
        self.concurrency = concurrency
        self.window = 2 * concurrency
        self.max_line_bytes = max_line_bytes
        self.max_lines = max_lines
        self.request_retries = request_retries


class InputGone(Exception):
    """The batch's input file (or s3:// object) no longer exists."""


class BatchJob:
    def __init__(self, state: BatchState, store: ObjectStore, files: FileStore, models: set[str], send: Send,
                 limits: BatchLimits):
        self.state = state
        self.store = store
        self.files = files
        self.models = models
        self.send = send
        self.limits = limits

    @property
    def batch(self) -> Batch:
        return self.state.batch

    @property
    def progress(self) -> Progress:
        return self.state.progress

    @property
    def id(self) -> str:
        return self.batch.id

    def state_key(self) -> str:
        return f"batches/{self.id}/state.json"

    def _part_key(self, window: int, kind: str) -> str:
        return f"batches/{self.id}/parts/{window:08d}-{kind}.jsonl"

    async def save(self) -> None:
        await asyncio.to_thread(self.store.put_json, self.state_key(), self.state.model_dump())

    def _set_status(self, status: Status) -> None:
        self.batch.status = status
        setattr(self.batch, f"{status}_at", int(time.time()))

    def cancel(self) -> None:
        if self.batch.status in ("validating", "in_progress"):
            self._set_status("cancelling")

    # --- running ------------------------------------------------------------

    async def run(self) -> None:
        try:
            if self.batch.status == "validating":
                await self._validate()
            if self.batch.status in ("in_progress", "cancelling"):
                await self._process()
            if self.batch.status not in TERMINAL:
                await self._finalize()
        except asyncio.CancelledError:
            raise  # the manager is stopping; progress so far is saved
        except InputGone:
            if self.batch.status == "cancelling":
                await self._finalize()  # cancelled, with what was done
            else:
                self._fail("input_file_missing", "the input file was deleted before the batch finished reading it")
                await self.save()
        except StoreError as e:
            logger.warning("batch %s: storage error, will resume: %s", self.id, e)
            raise
        except Exception as e:
            logger.exception("batch %s failed", self.id)
            self._fail("internal_error", f"the batch failed: {type(e).__name__}: {e}")
            await self.save()

    def _input_lines(self) -> Iterator[bytes]:
        uri = self.progress.input_uri
        store, key = open_s3_object(uri) if uri.startswith("s3://") else (self.store, uri)
        try:
            yield from store.iter_lines(key)
        except MissingObjectError:
            raise InputGone(uri) from None

    async def _validate(self) -> None:
        total = await asyncio.to_thread(lambda: sum(1 for line in self._input_lines() if line.strip()))
        if total == 0:
            self._fail("empty_file", "the input file has no requests")
        elif total > self.limits.max_lines:
            self._fail("too_many_lines", f"the input file has {total} requests; the limit is {self.limits.max_lines}")
        else:
            self.batch.request_counts.total = total
            if self.batch.status == "validating":
                self._set_status("in_progress")
        await self.save()

    def _fail(self, code: str, message: str) -> None:
        self.batch.errors = BatchErrors(data=[BatchError(code=code, message=message)])
        self._set_status("failed")

    async def _process(self) -> None:
        seen: set[str] = set()
        window: list[tuple[int, bytes]] = []
        lines = self._input_lines()
        line_no = 0
        while True:
            raw = await asyncio.to_thread(next, lines, None)
            if raw is not None:
                line_no += 1
                if not raw.strip():
                    continue
                if line_no <= self.progress.lines_done:
                    custom_id = peek_custom_id(raw)
                    if custom_id:
                        seen.add(custom_id)
                    continue
                window.append((line_no, raw))
            if window and (raw is None or len(window) == self.limits.window):
                if self._should_stop():
                    break
                await self._run_window(window, seen)
                window = []
            if raw is None:
                break

    def _should_stop(self) -> bool:
        if self.batch.status == "cancelling":
            return True
        if time.time() > self.batch.expires_at:
            self.progress.expired = True
            return True
        return False

    async def _run_window(self, window: list[tuple[int, bytes]], seen: set[str]) -> None:
        index = self.progress.windows_done
        limit = asyncio.Semaphore(self.limits.concurrency)

        async def one(line_no: int, raw: bytes):
            request_id = f"{self.id}-req_{line_no - 1}"
            try:
                request = parse_line(raw, self.batch.endpoint, self.models, seen, self.limits.max_line_bytes)
            except LineError as e:
                self._count(ok=False)
                return "err", {"id": request_id, "custom_id": e.custom_id, "response": None,
                               "error": {"code": "invalid_request", "message": f"line {line_no}: {e}",
                                         "line": line_no}}
            async with limit:
                status, body = await self._send_with_retries(request, request_id)
            ok = status == 200
            self._count(ok)
            return ("out" if ok else "err"), {
                "id": request_id, "custom_id": request.custom_id, "error": None,
                "response": {"status_code": status, "request_id": request_id, "body": body}}

        counts_before = self.batch.request_counts.model_copy()
        try:
            results = await asyncio.gather(*(one(n, raw) for n, raw in window))
            for kind in ("out", "err"):
                data = "".join(json.dumps(line) + "\n" for k, line in results if k == kind).encode()
                await asyncio.to_thread(self.store.put, self._part_key(index, kind), data)
        except BaseException:
            self.batch.request_counts = counts_before  # this window will be redone
            raise
        self.progress.windows_done = index + 1
        self.progress.lines_done = window[-1][0]
        await self.save()

    def _count(self, ok: bool) -> None:
        """One more request done: in the batch's request_counts and in the metrics."""
        if ok:
            self.batch.request_counts.completed += 1
        else:
            self.batch.request_counts.failed += 1
        count_batch("request", "completed" if ok else "failed")

    async def _send_with_retries(self, request: BatchRequest, request_id: str) -> tuple[int, dict]:
        for attempt in range(self.limits.request_retries + 1):
            try:
                return await self.send(request, request_id)
            except Exception as e:  # a replica died or restarted: Serve routes the retry elsewhere
                if attempt == self.limits.request_retries:
                    return 500, {"error": {"message": f"request failed: {type(e).__name__}", "type": "server_error",
                                           "param": None, "code": None}}
                await asyncio.sleep(min(2**attempt, 10))

    async def _finalize(self) -> None:
        if self.batch.status == "cancelling":
            final = "cancelled"
        else:
            final = "expired" if self.progress.expired else "completed"
        if final == "completed":
            self._set_status("finalizing")
            await self.save()
        for kind, field in (("out", "output"), ("err", "error")):
            parts = [self._part_key(i, kind) for i in range(self.progress.windows_done)]
            file_id = f"file-{self.id[len('batch_'):]}-{field}"
            meta = await asyncio.to_thread(self._concatenate, parts, file_id)
            if meta is not None:
                setattr(self.batch, f"{field}_file_id", file_id)
                setattr(self.batch, f"{field}_file_uri", self.store.uri_of(FileStore.content_key(file_id)))
        self._set_status(final)
        await self.save()
        count_batch("batch", final)
        await asyncio.to_thread(self._delete_parts)

    def _concatenate(self, parts: list[str], file_id: str) -> dict | None:
        sizes = [self.store.size(p) or 0 for p in parts]
        if not any(sizes):
            return None
        chunks = (chunk for p, size in zip(parts, sizes) if size for chunk in self.store.iter_chunks(p))
        name = f"{self.id}_{file_id.rsplit('-', 1)[1]}.jsonl"
        return self.files.create(name, "batch_output", chunks, file_id, owner=self.progress.owner)

    def _delete_parts(self) -> None:
        for key in self.store.list(f"batches/{self.id}/parts/"):
            self.store.delete(key)
