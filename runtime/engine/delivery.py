"""Which of a step's deltas to hand on now, and which to hold back and merge.

A request's first delta and its last go at once; the ones between at most once per interval, each merged with
those held back before it. A server's cost is per delta handed on (a wake-up, an event, a message between
processes), so a 16-token answer costs three or four of them, not sixteen; the tokens are the same. A request
whose caller wants only the whole answer (not streamed) gets two: its first (which times the first token)
and its last, with everything between merged into it.
"""

import math
import time

from runtime.outputs import RequestDelta


class DeliverySchedule:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        # request id -> (its deltas held back, merged into one; when it last sent)
        self._held: dict[str, tuple[RequestDelta | None, float]] = {}
        self._whole: set[str] = set()  # ids of requests that are not streamed

    def start(self, request_id: str, stream: bool) -> None:
        """A request enters the engine; `stream` False: its caller reads only the whole answer."""
        if not stream and self.interval_s > 0:
            self._whole.add(request_id)

    def due(self, deltas: list[RequestDelta]) -> list[RequestDelta]:
        """The deltas to hand on now, a request's held ones merged into its next."""
        if self.interval_s <= 0:
            return deltas
        now = time.monotonic()
        out = []
        for delta in deltas:
            held, sent_at = self._held.get(delta.request_id, (None, float("-inf")))
            if held is not None:  # merged into the held ones, which go as one
                held.append(delta)
            interval = math.inf if delta.request_id in self._whole else self.interval_s
            if delta.finished:
                self.forget(delta.request_id)
                out.append(held or delta)
            elif now - sent_at >= interval:
                self._held[delta.request_id] = (None, now)
                out.append(held or delta)
            else:
                self._held[delta.request_id] = (held or delta.own_copy(), sent_at)
        return out

    def forget(self, request_id: str) -> None:
        """A request that finished, or was aborted (it has no last delta to end it)."""
        self._held.pop(request_id, None)
        self._whole.discard(request_id)
