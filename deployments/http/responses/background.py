"""Background responses (`background: true`): the request returns at once with a `queued` response, the turn runs
on the ingress replica that took it, and its stored record says how it stands (`queued`, `in_progress`, then
`completed`, `incomplete`, `failed` or `cancelled`), which `GET /v1/responses/{id}` reads from any replica.

A background response made with `stream: true` also keeps its events (background_stream.py), which its creator
reads as they come and `GET /v1/responses/{id}?stream=true` replays, on any replica.

`POST /v1/responses/{id}/cancel` marks the record cancelled, from any replica; the replica running the turn reads
its record every WATCH_S and stops the turn (its engine request is aborted) once it sees the mark. While it runs
it also stamps it every HEARTBEAT_S, in an object of its own (never writing the record a cancel may be writing): a
response left `queued` or `in_progress` with no stamp for LOST_S (its replica died, or was stopped past its drain
bound) reads as `failed`. An ingress replica that Serve stops finishes its background turns before it goes, up to
its drain bound (deployments/builder.py).
"""

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from deployments.errors import OpenAIError
from deployments.http.responses.background_stream import LOST_S, WATCH_S, BackgroundStream, follow_stored
from deployments.http.responses.store import ResponseStore

logger = logging.getLogger("ray.serve")

HEARTBEAT_S = 10.0
RUNNING = ("queued", "in_progress")


class BackgroundResponses:
    def __init__(self, store: ResponseStore, per_key: int):
        """`per_key`: the background turns a key may run on this replica at once (its requests in flight)."""
        self.store = store
        self.per_key = per_key
        self.tasks: set[asyncio.Task] = set()
        self.running: dict[str | None, int] = {}
        self.streams: dict[tuple[str | None, str], BackgroundStream] = {}  # the streamed turns this replica runs

    def check_room(self, owner: str | None) -> None:
        """A 429 when this key runs as many background turns here as it may."""
        if self.running.get(owner, 0) >= self.per_key:
            raise OpenAIError(429, f"this key runs {self.per_key} background responses on this replica, as many as "
                                   "it may at once; wait for one to finish", None, "rate_limit_exceeded")

    async def start(self, owner: str | None, response_id: str, turn: Callable[[], Awaitable[dict]],
                    save: Callable[[dict], Awaitable[None]], stream: BackgroundStream | None = None) -> None:
        """Run `turn` (its finished response) in the background, watched for a cancel mark, then `save` what it
        made. `stream`: where a streamed turn adds its events; this ends it and writes it to the store."""
        await self.store.stamp(owner, response_id, time.time())
        if stream is not None:
            await stream.flush()  # its first chunk says the response streams
            self.streams[owner, response_id] = stream
        # in a context of its own: inside the request's, Serve would cancel the turn's calls to the model with the
        # request (a streamed one's client leaving)
        task = asyncio.create_task(self._run(owner, response_id, turn, save, stream), context=contextvars.Context())
        self.tasks.add(task)
        self.running[owner] = self.running.get(owner, 0) + 1
        task.add_done_callback(lambda _: self._done(owner, response_id, task))

    async def follow(self, owner: str | None, response_id: str, after: int) -> AsyncIterator[dict]:
        """A streamed background response's events numbered after `after`: as they come where it runs here, else
        from the store (`background_stream.py`)."""
        record = await self.store.load(owner, response_id)
        if not record["response"].get("background") or not await self.store.has_events(owner, response_id):
            raise OpenAIError(400, "Only responses created with background=true and stream=true can be streamed.",
                              "stream", "invalid_request")
        if (owner, response_id) in self.streams:
            return self.streams[owner, response_id].follow(after)

        async def record_now() -> dict:
            return await self.current(owner, await self.store.load(owner, response_id))

        return follow_stored(self.store, owner, response_id, after, record_now)

    def _done(self, owner: str | None, response_id: str, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.streams.pop((owner, response_id), None)
        self.running[owner] -= 1
        if not self.running[owner]:
            del self.running[owner]

    async def cancel(self, owner: str | None, response_id: str) -> dict:
        """Mark a queued or running background response cancelled (a cancelled one again: as it is)."""
        record = await self.store.load(owner, response_id)
        response = record["response"]
        if not response.get("background"):
            raise OpenAIError(400, "Only responses created with background=true can be cancelled.", None,
                              "invalid_request")
        if response["status"] == "cancelled":
            return response
        if response["status"] not in RUNNING:
            raise OpenAIError(400, f"Cannot cancel a response that is {response['status']}.", None,
                              "invalid_request")
        return await self._mark(owner, record, "cancelled")

    async def current(self, owner: str | None, record: dict) -> dict:
        """The stored response, read as `failed` if it is left running with no replica stamping it."""
        response = record["response"]
        if not response.get("background") or response["status"] not in RUNNING:
            return response
        stamped = await self.store.stamped(owner, response["id"])
        if stamped is not None and time.time() - stamped <= LOST_S:
            return response
        await self.store.stamp(owner, response["id"], None)
        return await self._mark(owner, record, "failed", {
            "code": "server_error", "message": "the replica running this background response stopped before it "
                                               "finished; create it again"})

    async def drain(self) -> None:
        """Wait for the background turns this replica runs (its drain, before Serve stops it)."""
        if self.tasks:
            logger.info("waiting for %d background responses to finish", len(self.tasks))
            await asyncio.wait(set(self.tasks))

    async def _run(self, owner: str | None, response_id: str, turn: Callable[[], Awaitable[dict]],
                   save: Callable[[dict], Awaitable[None]], stream: BackgroundStream | None) -> None:
        work, ended = None, None  # the response as it ended, for the stream's last events
        try:
            record = await self.store.load(owner, response_id)
            if record["response"]["status"] != "queued":  # cancelled already
                ended = record["response"]
                return
            await self._mark(owner, record, "in_progress")
            work = asyncio.create_task(turn())
            stamped = time.time()
            while True:
                await asyncio.wait({work}, timeout=WATCH_S)
                if (now := (await self.store.load(owner, response_id))["response"])["status"] == "cancelled":
                    work.cancel()
                    ended = now
                    return
                if work.done():
                    break
                if time.time() - stamped >= HEARTBEAT_S:
                    stamped = time.time()
                    await self.store.stamp(owner, response_id, stamped)
                if stream is not None:
                    await stream.flush()
            ended = work.result()
            await save(ended)
        except asyncio.CancelledError:
            if work is not None:
                work.cancel()
            raise
        except Exception as e:  # the turn failed, or the store did: its record says why
            if work is not None:
                work.cancel()
            error = e.body()["error"] if isinstance(e, OpenAIError) else {"message": repr(e)}
            error = {"code": error.get("code") or "server_error", "message": error["message"]}
            try:
                ended = await self._mark(owner, await self.store.load(owner, response_id), "failed", error)
            except OpenAIError as lost:  # deleted meanwhile, or the store is unreachable
                logger.warning("background response %s: %s (%s)", response_id, error["message"], lost.message)
                ended = stream.events.response("failed", error=error) if stream is not None else None
        finally:
            await self._let_go(owner, response_id, stream, ended)

    async def _let_go(self, owner: str | None, response_id: str, stream: BackgroundStream | None,
                      ended: dict | None) -> None:
        """End the stream (unless this replica is stopped mid-turn: a lost one), write the rest of it, then the
        stamp goes (a reader elsewhere ends a log its stamp outlived only once the stamp is gone)."""
        try:
            if stream is not None:
                if ended is not None:
                    stream.end(ended)
                await stream.flush()
            await self.store.stamp(owner, response_id, None)
        except OpenAIError:
            pass  # a stale stamp reads as a lost replica after LOST_S: the same end

    async def _mark(self, owner: str | None, record: dict, status: str, error: dict | None = None) -> dict:
        response = {**record["response"], "status": status, "error": error}
        await self.store.put(owner, {**record, "response": response}, replacing=True)
        return response
