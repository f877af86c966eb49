"""One batch job: the loop that runs a batch (its state in state.py) to a final status.

The input is streamed a chunk of lines at a time and cut into windows of
lines. Lines start as their model has free capacity (capacity.py), whatever
window they belong to, so the replicas stay busy across window boundaries.
Windows are committed in order: once a window's last line finishes, it and the
windows after it whose lines are done by then are written as one part object
per kind (output lines, error lines), keyed by the group's first window, and
only then is the job's progress saved; a store's round trips (tens of
milliseconds each on S3) are paid per commit, not per window. A restarted
manager deletes the parts written past the saved windows and resumes at the
first unsaved one, so no line is lost or written twice; the saved
request_counts are those of the saved windows. When the input is done (or
the batch is cancelled or expires, which stops new lines and lets those in
flight finish), the parts are concatenated into the output and error files.
The manager holds at most a look-ahead of uncommitted lines, whatever the
batch's size.
"""

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from deployments.api.sampling_fields import salted_by_owner
from deployments.batch.capacity import Capacity
from deployments.batch.files import FileStore
from deployments.batch.index import state_key
from deployments.batch.input_line import BatchRequest, LineError, parse_line, peek_custom_id
from deployments.batch.state import TERMINAL, Batch, BatchError, BatchErrors, BatchState, Progress, Status
from deployments.metrics import count_batch
from deployments.storage import MissingObjectError, ObjectStore, StoreError, open_s3_object

logger = logging.getLogger(__name__)

Send = Callable[[BatchRequest, str], Awaitable[tuple[int, dict]]]
Slots = Callable[[str], Capacity]  # a model's shared capacity

_READ_CHUNK = 256  # input lines read per hop to a thread
_ERROR_CHARS = 1024  # of a failed batch's message (an exception's text): batch objects stay within ~70 kB
_AHEAD_WINDOWS = 8  # uncommitted lines a batch may hold: this many windows, or twice its model's capacity


class BatchLimits:
    """`concurrency` is per replica: a model's batch lines in flight are it (or the model's own figure in
    `seats`) times its running replicas."""

    def __init__(self, concurrency: int = 64, max_line_bytes: int = 1 << 20, max_lines: int = 50_000,
                 request_retries: int = 3, seats: dict[str, int] | None = None, max_active_per_key: int = 100,
                 salt_by_key: bool = True):
        self.concurrency, self.salt_by_key = concurrency, salt_by_key  # salt_by_key: `cache_salt_by_key`
        self.max_active_per_key = max_active_per_key  # an API key's unfinished batches
        self.seats = seats or {}
        self.window = 2 * concurrency
        self.max_line_bytes = max_line_bytes
        self.max_lines = max_lines
        self.request_retries = request_retries

    def per_replica(self, model: str) -> int:
        """The model's batch lines in flight per running replica."""
        return self.seats.get(model, self.concurrency)


class InputGone(Exception):
    """The batch's input file (or s3:// object) no longer exists."""


@dataclass
class _Window:
    index: int
    results: list[Awaitable[tuple[bool, str]]] = field(default_factory=list)  # (ok, output line) of each line
    last_line: int = 0

    def finished(self) -> bool:
        return all(result.done() for result in self.results)


class _ClosedWindows:
    """The windows whose lines have all started, in input order, handed to the committer a group at a time."""

    def __init__(self):
        self._windows: deque[_Window | None] = deque()  # None: the last one was closed
        self._added = asyncio.Event()

    def close(self, window: _Window | None) -> None:
        self._windows.append(window)
        self._added.set()

    async def next_group(self) -> list[_Window]:
        """The first window once its lines are done, with the windows after it whose lines are done by then;
        [] once the last window was handed out."""
        while not self._windows:
            self._added.clear()
            await self._added.wait()
        if self._windows[0] is None:
            return []
        await asyncio.gather(*self._windows[0].results)
        group = [self._windows.popleft()]
        while self._windows and self._windows[0] is not None and self._windows[0].finished():
            group.append(self._windows.popleft())
        return group


class BatchJob:
    def __init__(self, state: BatchState, store: ObjectStore, files: FileStore, models: set[str], send: Send,
                 limits: BatchLimits, slots: Slots | None = None):
        self.state = state
        self.store = store
        self.files = files
        self.models = models
        self.send = send
        self.limits = limits
        own: dict[str, Capacity] = {}
        self.slots = slots or (lambda model: own.setdefault(model, Capacity(limits.per_replica(model))))
        counts = state.batch.request_counts
        self._committed = (counts.completed, counts.failed)  # those of the saved windows
        self._uncommitted = 0
        self._room = asyncio.Event()  # a window was committed
        self._in_flight: set[asyncio.Task] = set()
        self._writing: set[asyncio.Future] = set()  # store writes under way, shielded from cancellation

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
        return state_key(self.id)

    def _parts_prefix(self) -> str:
        return f"batches/{self.id}/parts/"

    def _part_key(self, window: int, kind: str) -> str:
        """The part of `kind` ("out" or "err") of the group of windows that starts at `window`."""
        return f"{self._parts_prefix()}{window:08d}-{kind}.jsonl"

    async def save(self) -> None:
        """Store the state, with the request counts of the committed windows (the live ones run ahead)."""
        state = self.state.model_dump()
        state["batch"]["request_counts"].update(completed=self._committed[0], failed=self._committed[1])
        await self._write((self.store.put_json, self.state_key(), state))

    async def _write(self, *writes: tuple) -> None:
        """Store writes, (function, *args) each, run at once. They are shielded: one that a cancel or a failed
        neighbour interrupts still ends before this job runs again (`_clear_unsaved_parts`), so no write of
        an earlier run lands over a later one's."""
        done = asyncio.gather(*(asyncio.to_thread(*write) for write in writes), return_exceptions=True)
        self._writing.add(done)
        done.add_done_callback(self._writing.discard)
        for outcome in await asyncio.shield(done):
            if isinstance(outcome, BaseException):
                raise outcome

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
        self.batch.errors = BatchErrors(data=[BatchError(code=code, message=message[:_ERROR_CHARS])])
        self._set_status("failed")

    async def _process(self) -> None:
        """Dispatch lines as capacity frees, window after window, while a second task commits the windows in
        order as each one's last line finishes: the next windows run while an earlier one's tail does."""
        seen: set[str] = set()
        self._uncommitted = 0
        await self._clear_unsaved_parts()
        closed = _ClosedWindows()
        committer = asyncio.get_running_loop().create_task(self._commit_in_order(closed))
        window = _Window(self.progress.windows_done)
        try:
            async for line_no, raw in self._numbered_lines():
                if line_no <= self.progress.lines_done:  # committed by an earlier run
                    if custom_id := peek_custom_id(raw):
                        seen.add(custom_id)
                    continue
                if self._should_stop():
                    break
                await self._dispatch(window, line_no, raw, seen, committer)
                if len(window.results) == self.limits.window:
                    closed.close(window)
                    window = _Window(window.index + 1)
            if window.results:
                closed.close(window)
            closed.close(None)
            await committer
        except BaseException:
            committer.cancel()
            for task in list(self._in_flight):
                task.cancel()
            self.batch.request_counts.completed, self.batch.request_counts.failed = self._committed
            raise  # uncommitted windows are redone by the next run

    async def _numbered_lines(self) -> AsyncIterator[tuple[int, bytes]]:
        """The input's non-blank lines with their 1-based line numbers, read in a thread a chunk at a time."""
        numbered = ((n, raw) for n, raw in enumerate(self._input_lines(), 1) if raw.strip())
        while chunk := await asyncio.to_thread(lambda: list(islice(numbered, _READ_CHUNK))):
            for item in chunk:
                yield item

    def _should_stop(self) -> bool:
        if self.batch.status == "cancelling":
            return True
        if time.time() > self.batch.expires_at:
            self.progress.expired = True
            return True
        return False

    async def _dispatch(self, window: "_Window", line_no: int, raw: bytes, seen: set[str],
                        committer: asyncio.Task) -> None:
        """Parse one line and start its request once its model has a free slot and the uncommitted lines
        are within the look-ahead; a bad line's error is its result at once."""
        request_id = f"{self.id}-req_{line_no - 1}"
        window.last_line = line_no
        self._uncommitted += 1
        try:
            request = parse_line(raw, self.batch.endpoint, self.models, seen, self.limits.max_line_bytes)
        except LineError as e:
            self._count(ok=False)
            done = asyncio.get_running_loop().create_future()
            done.set_result((False, _line_json(request_id, e.custom_id, None, {
                "code": "invalid_request", "message": f"line {line_no}: {e}", "line": line_no})))
            window.results.append(done)
            return
        if self.limits.salt_by_key:
            salted_by_owner(request.body, self.progress.owner)
        slots = self.slots(request.model)
        while self._uncommitted > max(_AHEAD_WINDOWS * self.limits.window, 2 * slots.limit):
            self._room.clear()
            await self._room.wait()
            if committer.done():
                committer.result()  # its error ends the run; a clean end cannot come before the last window
        await slots.acquire(self.progress.owner, self.id)
        task = asyncio.get_running_loop().create_task(self._request(request, request_id, slots))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        window.results.append(task)

    async def _request(self, request: BatchRequest, request_id: str, slots: Capacity) -> tuple[bool, str]:
        """(ok, output line) of one parsed line; its slot is released when its reply is in."""
        try:
            status, body = await self._send_with_retries(request, request_id)
        finally:
            slots.release()
        ok = status == 200
        self._count(ok)
        return ok, _line_json(request_id, request.custom_id,
                              {"status_code": status, "request_id": request_id, "body": body}, None)

    async def _commit_in_order(self, closed: _ClosedWindows) -> None:
        """The closed windows, in order, a group at a time once their lines are done: the group's output and
        error lines are written as one part each (none for a kind it has no line of), then the progress saved.
        A restarted manager resumes at the first window not saved."""
        try:
            while group := await closed.next_group():
                results = [result.result() for window in group for result in window.results]
                parts = {kind: "".join(line for line_ok, line in results if line_ok is ok).encode()
                         for kind, ok in (("out", True), ("err", False))}
                await self._write(*((self.store.put, self._part_key(group[0].index, kind), data)
                                    for kind, data in parts.items() if data))
                completed = sum(ok for ok, _ in results)
                self._committed = (self._committed[0] + completed, self._committed[1] + len(results) - completed)
                self.progress.windows_done = group[-1].index + 1
                self.progress.lines_done = group[-1].last_line
                await self.save()
                self._uncommitted -= len(results)
                self._room.set()
        finally:
            self._room.set()  # a dispatcher waiting for room sees how this ended

    async def _clear_unsaved_parts(self) -> None:
        """Before lines run again: the store writes of an earlier run in this process end, then the parts
        written past the saved windows (a group whose save a kill, a store error or a cancel cut short) are
        deleted, so every part left is a saved group's and the next group's parts replace nothing."""
        if self._writing:
            await asyncio.wait(set(self._writing))
        stored = await asyncio.to_thread(self._stored_parts)
        unsaved = [key for window, _, key in stored if window >= self.progress.windows_done]
        if unsaved:
            await asyncio.to_thread(self.store.delete_many, unsaved)

    def _stored_parts(self) -> list[tuple[int, str, str]]:
        """(first window, kind, key) of each part in the store, in window order."""
        parts = []
        for key in self.store.list(self._parts_prefix()):
            window, kind = key.rsplit("/", 1)[1].removesuffix(".jsonl").split("-")
            parts.append((int(window), kind, key))
        return parts

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
        stored = await asyncio.to_thread(self._stored_parts)
        for kind, name, lines in (("out", "output", self._committed[0]), ("err", "error", self._committed[1])):
            if not lines:
                continue
            parts = [key for window, part_kind, key in stored
                     if part_kind == kind and window < self.progress.windows_done]
            file_id = f"file-{self.id[len('batch_'):]}-{name}"
            await asyncio.to_thread(self._concatenate, parts, file_id)
            setattr(self.batch, f"{name}_file_id", file_id)
            setattr(self.batch, f"{name}_file_uri", self.store.uri_of(FileStore.content_key(file_id)))
        self._set_status(final)
        await self.save()
        count_batch("batch", final)
        await asyncio.to_thread(self.store.delete_many, [key for _, _, key in stored])

    def _concatenate(self, parts: list[str], file_id: str) -> None:
        name = f"{self.id}_{file_id.rsplit('-', 1)[1]}.jsonl"
        self.files.create(name, "batch_output", self.store.iter_concatenated(parts), file_id,
                          owner=self.progress.owner)


def _line_json(request_id: str, custom_id: str | None, response: dict | None, error: dict | None) -> str:
    """One line of the output or error file."""
    return json.dumps({"id": request_id, "custom_id": custom_id, "response": response, "error": error}) + "\n"
