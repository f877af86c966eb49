"""How many batch lines may be in flight to one model: a limit that follows its running replicas.

Every batch the manager runs takes its lines' slots from the model's one
`Capacity`, so several batches share the replicas rather than each adding
its own fan-out. A batch asks for one slot at a time (it waits for a slot
before it reads on), and waiters are served first come, first served, so
batches waiting together get slots in turn.
"""

import asyncio
import logging
from collections import deque

from ray import serve

logger = logging.getLogger(__name__)


class Capacity:
    """A counting semaphore whose limit can change while it is held."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled: hand the slot on
                self.release()
            elif waiter in self._waiters:  # (a grant may already have passed over it, cancelled)
                self._waiters.remove(waiter)
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
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += 1
                waiter.set_result(None)


def running_replicas(app_name: str, deployments: dict[str, str]) -> dict[str, int]:
    """Each model's RUNNING replicas, as Serve's controller reports them (0 for a model it does not list)."""
    app = serve.status().applications.get(app_name)
    found = app.deployments if app else {}
    return {model: found[name].replica_states.get("RUNNING", 0) if name in found else 0
            for model, name in deployments.items()}
