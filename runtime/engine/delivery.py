"""Which of a step's deltas to hand on now, and which to hold back and merge.

A request's first delta and its last go at once; the ones between at most once per interval, each merged with
those held back before it. A server's cost is per delta handed on (a wake-up, an event, a message between
processes), so a 16-token answer costs three or four of them, not sixteen; the tokens are the same. A request
whose caller wants only the whole answer (not streamed) gets two: its first (which times the first token)
and its last, with everything between merged into it.

Owners (API keys) share the deliveries as the scheduler shares steps: while more than one owner has streams
open, an owner's streams together get at most FAIR_STREAMS streams' worth of deliveries per interval (each of
its streams' intervals grows with their number), so one key's hundreds of streams do not take the server's
event loops from another key's requests.
"""

import math
import time
from collections import Counter

from runtime.outputs import RequestDelta

FAIR_STREAMS = 32


class DeliverySchedule:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        # request id -> (its deltas held back, merged into one; when it last sent)
        self._held: dict[str, tuple[RequestDelta | None, float]] = {}
        self._whole: set[str] = set()  # ids of requests that are not streamed
        self._owner_of: dict[str, str] = {}  # request id -> its owner, where it has one
        self._open = Counter()  # owner -> its requests open
        self._streams = Counter()  # owner -> its streamed requests open

    def start(self, request_id: str, stream: bool, owner: str | None = None) -> None:
        """A request enters the engine; `stream` False: its caller reads only the whole answer."""
        if self.interval_s <= 0:
            return
        if not stream:
            self._whole.add(request_id)
        if owner is not None:
            self._owner_of[request_id] = owner
            self._open[owner] += 1
            self._streams[owner] += stream

    def _interval(self, request_id: str) -> float:
        if request_id in self._whole:
            return math.inf
        owner = self._owner_of.get(request_id)
        if owner is None or len(self._open) < 2:
            return self.interval_s
        return self.interval_s * max(1.0, self._streams[owner] / FAIR_STREAMS)

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
            interval = self._interval(delta.request_id)
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
        owner = self._owner_of.pop(request_id, None)
        if owner is not None:
            self._streams[owner] -= request_id not in self._whole
            self._open[owner] -= 1
            if not self._open[owner]:
                self._open.pop(owner)
                self._streams.pop(owner)
        self._whole.discard(request_id)
