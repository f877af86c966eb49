"""Batch lines to one model, coalesced: the lines a batch starts in the same turn of the event loop go to a
replica in one call (up to MAX_LINES), so a line costs the manager and the replica a share of one Ray hop, not
one hop each. Each line still gets its own (status, body) as soon as its group's call returns."""

import asyncio
from collections.abc import Awaitable, Callable

MAX_LINES = 16  # per call: a model's batch capacity (its engine's seats, a replica) spans several calls

Line = tuple[object, str]  # (request body, request id)
Answer = Callable[[list[Line]], Awaitable[list[tuple[int, dict]]]]


class LineGroups:
    def __init__(self, answer: Answer):
        self.answer = answer
        self._pending: list[tuple[Line, asyncio.Future]] = []
        self._flush_scheduled = False

    def send(self, body, request_id: str) -> Awaitable[tuple[int, dict]]:
        """The line's (status, body); raises what the group's call raised (a lost replica: the line is retried)."""
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
            answers = await self.answer([line for line, _ in group])
        except Exception as e:
            for _, answered in group:
                if not answered.done():
                    answered.set_exception(e)
            return
        for (_, answered), answer in zip(group, answers):
            if not answered.done():
                answered.set_result(answer)
