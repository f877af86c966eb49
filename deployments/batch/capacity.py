"""How many batch lines may be in flight to one model: a limit that follows its running replicas.

Every batch the manager runs takes its lines' slots from the model's one
`Capacity`, so several batches share the replicas rather than each adding
its own fan-out. A batch asks for one slot at a time (it waits for a slot
before it reads on). Waiting slots go to the owners (API keys) in turn, and
within an owner to its batches in turn: a key's share does not grow with the
number of batches it splits its work into, and one key's backlog never stands
in front of another key's first line.
"""

import asyncio
import logging
from collections import OrderedDict, deque

from ray import serve

logger = logging.getLogger(__name__)


class Capacity:
    """A counting semaphore whose limit can change while it is held, fair among owners, then among batches."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        # owner -> batch -> its waiters; dict order is the turn order
        self._waiters: OrderedDict[str | None, OrderedDict[str | None, deque[asyncio.Future]]] = OrderedDict()

    async def acquire(self, owner: str | None = None, batch: str | None = None) -> None:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(owner, OrderedDict()).setdefault(batch, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled: hand the slot on
                self.release()
            else:  # (a grant may already have passed over it, cancelled)
                self._forget(owner, batch, waiter)
            raise

    def release(self) -> None:
        self.used -= 1
        self._grant()

    def resize(self, limit: int) -> None:
        """A new limit; lines already in flight over a lower one finish, and no new one starts until below it."""
        self.limit = limit
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used < self.limit:
            owner, batches = next(iter(self._waiters.items()))
            batch, queue = next(iter(batches.items()))
            waiter = queue.popleft()
            self._waiters.move_to_end(owner)  # the next slot goes to the next owner, and this owner's to its next
            batches.move_to_end(batch)
            self._drop_empty(owner, batch)
            if not waiter.done():
                self.used += 1
                waiter.set_result(None)

    def _forget(self, owner: str | None, batch: str | None, waiter: asyncio.Future) -> None:
        queue = self._waiters.get(owner, {}).get(batch)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self._drop_empty(owner, batch)

    def _drop_empty(self, owner: str | None, batch: str | None) -> None:
        batches = self._waiters[owner]
        if not batches[batch]:
            del batches[batch]
            if not batches:
                del self._waiters[owner]


def running_replicas(app_name: str, deployments: dict[str, str]) -> dict[str, int]:
    """Each model's RUNNING replicas, as Serve's controller reports them (0 for a model it does not list)."""
    app = serve.status().applications.get(app_name)
    found = app.deployments if app else {}
    return {model: found[name].replica_states.get("RUNNING", 0) if name in found else 0
            for model, name in deployments.items()}
