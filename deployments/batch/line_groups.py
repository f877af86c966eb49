"""Batch lines to one model, coalesced: the lines a batch starts in the same turn of the event loop go to a
replica in one streaming call (up to MAX_LINES), so a line costs the manager and the replica a share of one Ray hop,
not one hop each. The replica streams the lines' answers back as they finish, so each line's slot frees when its
own answer is in, not when its group's slowest line is."""

import asyncio
from collections.abc import AsyncIterator, Callable

# per call: a replica's batch capacity (its engine's seats) spans several calls, so each line routes to a replica
# with room; at 16 a line's share of the hop still capped the served batch near the engine's own rate
MAX_LINES = 64

Line = tuple[object, str]  # (request body, request id)
Answers = AsyncIterator[list[tuple[int, int, dict]]]  # (line index in the call, HTTP status, body) of lines done
Answer = Callable[[list[Line]], Answers]


class LineGroups:
    def __init__(self, answer: Answer):
        self.answer = answer
        self._pending: list[tuple[Line, asyncio.Future]] = []
        self._flush_scheduled = False

    def send(self, body, request_id: str) -> asyncio.Future:
        """The line's (status, body); raises what the group's call raised before answering it (a lost replica:
        the line is retried)."""
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        self._pending.append(((body, request_id), answered))
        if len(self._pending) >= MAX_LINES:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return answered

    def _flush(self) -> None:
        group, self._pending, self._flush_scheduled = self._pending, [], False
        if group:
            asyncio.get_running_loop().create_task(self._call(group))

    async def _call(self, group: list[tuple[Line, asyncio.Future]]) -> None:
        try:
            async for answers in self.answer([line for line, _ in group]):
                for index, status, body in answers:
                    if not group[index][1].done():
                        group[index][1].set_result((status, body))
            error: Exception = RuntimeError("the replica ended the call without answering every line")
        except Exception as e:
            error = e
        for _, answered in group:
            if not answered.done():
                answered.set_exception(error)
