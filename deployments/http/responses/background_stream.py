"""A background response's event stream (`background` and `stream` both true), which its creator reads as the turn
makes it and any later `GET /v1/responses/{id}?stream=true` reads again, from the first event or after
`starting_after`, on any replica.

The replica running the turn keeps the events in memory, where its own readers follow them as they come, and
writes those not yet written every WATCH_S (background.py), and the rest before it lets go of the response: each
write one chunk, `response-events/<owner>/<id>/<its first sequence number>.json`, the last one marked as the end.
A reader on another replica replays the chunks and polls for more; once no replica stamps the response and its
log has no end (its replica died), the reader ends the stream itself from the stored record.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from deployments.errors import OpenAIError
from deployments.http.responses.events import ResponseEvents
from deployments.http.responses.store import ResponseStore

WATCH_S = 2.0  # how often a background turn is checked for a cancel, its new events written, a stored log read
LOST_S = 60.0  # a running response no replica has stamped for this long has lost its replica


def ending(response: dict, sequence: int) -> list[dict]:
    """The events that end a stream whose response finished as `response` (completed, incomplete, failed or
    cancelled), numbered from `sequence`. A cancelled one ends with an `error` event (code `response_cancelled`):
    the Responses API has no event of its own for it."""
    if response["status"] == "failed":
        error = response["error"] or {"code": "server_error", "message": "the response failed"}
        return [{"type": "error", "sequence_number": sequence, "code": error["code"], "message": error["message"],
                 "param": None},
                {"type": "response.failed", "sequence_number": sequence + 1, "response": response}]
    if response["status"] == "cancelled":
        return [{"type": "error", "sequence_number": sequence, "code": "response_cancelled",
                 "message": "the response was cancelled", "param": None}]
    return [{"type": "response.completed", "sequence_number": sequence, "response": response}]


class BackgroundStream:
    def __init__(self, events: ResponseEvents, store: ResponseStore, owner: str | None):
        """Starts with `response.created` and `response.queued` (the queued response)."""
        self.events = events  # numbers the events, as the turn makes them
        self.store = store
        self.owner = owner
        queued = events.response("queued")
        self.log = [events.event("response.created", response=queued), events.event("response.queued", response=queued)]
        self.written = 0
        self.ended = False
        self._grew = asyncio.Event()

    def started(self) -> list[dict]:
        """`response.in_progress`, as the model's first chunk comes."""
        return [self.events.event("response.in_progress", response=self.events.response("in_progress"))]

    def add(self, event: dict) -> None:
        """A turn's event; none after the stream has ended."""
        if not self.ended:
            self.log.append(event)
            self._wake()

    def end(self, response: dict) -> None:
        """The events that end the stream (`ending`); later ones are not added."""
        if not self.ended:
            closing = ending(response, self.events.sequence)
            self.events.sequence += len(closing)
            self.log += closing
            self.ended = True
            self._wake()

    async def flush(self) -> None:
        """Write the events not written yet, as one chunk."""
        chunk, ended = self.log[self.written:], self.ended
        if chunk:
            await self.store.put_events(self.owner, self.events.response_id, self.written, chunk, ended)
            self.written += len(chunk)

    async def follow(self, after: int) -> AsyncIterator[dict]:
        """The events numbered after `after`, as they come, to the end."""
        seen = after + 1
        while True:
            grew = self._grew
            while seen < len(self.log):
                seen += 1
                yield self.log[seen - 1]
            if self.ended:
                return
            await grew.wait()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()


async def follow_stored(store: ResponseStore, owner: str | None, response_id: str, after: int,
                        record_now: Callable[[], Awaitable[dict]]) -> AsyncIterator[dict]:
    """The stored events numbered after `after`, polled for more while a replica stamps the response. `record_now`:
    the stored response as it reads now (a lost one's: failed), for the events that end a log its replica never
    ended. The store unreachable, or the response deleted, midway: an `error` event ends the stream."""
    try:
        async for event in _stored(store, owner, response_id, after, record_now):
            after = event["sequence_number"]
            yield event
    except OpenAIError as e:
        yield {"type": "error", "sequence_number": after + 1, "code": e.code or "server_error",
               "message": e.message, "param": None}


async def _stored(store: ResponseStore, owner: str | None, response_id: str, after: int,
                  record_now: Callable[[], Awaitable[dict]]) -> AsyncIterator[dict]:
    while True:
        # the stamp is read first: once it is gone, the events read next hold all its replica wrote
        stamped = await store.stamped(owner, response_id)
        events, ended = await store.events(owner, response_id, after)
        for event in events:
            after = event["sequence_number"]
            yield event
        if ended:
            return
        if stamped is None or time.time() - stamped > LOST_S:
            response = await record_now()
            if response["status"] not in ("queued", "in_progress"):  # else a replica stamped it again meanwhile
                for event in ending(response, after + 1):
                    yield event
                return
        await asyncio.sleep(WATCH_S)
