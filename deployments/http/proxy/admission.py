"""Admission by API key in Serve's Python proxy, before it routes a request.

Every request the proxy routes costs it, and the replica that takes it, a Ray call and turns of both event
loops. A key that opens a thousand requests at once would have them all routed ahead of another key's next
request, though the app's admission (key_admission.py) holds or refuses most of them the moment they arrive.
Here the proxy applies the same bounds first: a key's requests past its `max_requests_per_key` wait in the
proxy, unrouted, for one of its own to finish, up to `max_waiting_per_key` of them; the rest get the app's 429
at once. The proxy learns the apps' keys and bounds from what their replicas publish (published_keys.py,
read every REFRESH_S); a request with no key or one no app published passes as before. Each proxy (one per node)
counts its own requests; the app's admission still bounds the whole.

A request's arrival at the proxy goes with it to the app (`ARRIVED_AT`): the app's body rate rule counts its
grace from there, so waiting here does not renew a slow sender's grace.
"""

import asyncio
import logging
import time
from collections.abc import Callable

from starlette.datastructures import Headers

from deployments.http import published_keys
from deployments.http.auth import key_digest, sent_key
from deployments.http.key_admission import KeyGates, refuse_too_many
from deployments.http.request_limits import ARRIVED_AT

REFRESH_S = 5.0  # the published keys read again at least this often
UNKNOWN_KEY_REFRESH_S = 1.0  # ... and, for a key not among them (an app just deployed), at most this often
READ_TIMEOUT_S = 1.0  # a read that takes longer is waited for no more: the last keys read apply
logger = logging.getLogger(__name__)


class ProxyKeyAdmission:
    """ASGI middleware: the apps' per-key bounds, applied before Serve routes (see the module's docstring)."""

    def __init__(self, app, read_bounds: Callable[[], dict[str, tuple[int, int]]] = published_keys.read):
        """`read_bounds`: each published key's digest and its bounds (in flight, waiting)."""
        self.app = app
        self.read_bounds = read_bounds
        self._gates = KeyGates()
        self._bounds: dict[str, tuple[int, int]] = {}
        self._read_at = -REFRESH_S
        self._reading: asyncio.Future | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope[ARRIVED_AT] = time.time()
        key = sent_key(Headers(scope=scope)) if scope["method"] == "POST" else ""
        digest = key_digest(key) if key else None
        bounds = await self._bounds_of(digest) if digest else None
        if bounds is None:
            return await self.app(scope, receive, send)
        async with self._gates.turn(digest, *bounds) as admitted:
            if not admitted:
                return await refuse_too_many(scope, send, *bounds)
            await self.app(scope, receive, send)

    async def _bounds_of(self, digest: str) -> tuple[int, int] | None:
        """A key's bounds (None: no app published it), the published keys read again first where they are due."""
        since = time.monotonic() - self._read_at
        if since >= REFRESH_S or (since >= UNKNOWN_KEY_REFRESH_S and digest not in self._bounds):
            await self.refresh()
        return self._bounds.get(digest)

    async def refresh(self) -> None:
        """Reads the published keys off the event loop, one read shared by every request that waits for it; a
        read that fails or outlasts READ_TIMEOUT_S leaves the last keys read."""
        if self._reading is None:
            self._reading = asyncio.ensure_future(asyncio.to_thread(self.read_bounds))
            self._reading.add_done_callback(self._read_done)
        try:
            await asyncio.wait_for(asyncio.shield(self._reading), READ_TIMEOUT_S)
        except TimeoutError:
            self._read_at = time.monotonic()  # a read that hangs is waited for again only once the keys are due
        except Exception:
            pass  # logged once, by _read_done

    def _read_done(self, reading: asyncio.Future) -> None:
        self._reading, self._read_at = None, time.monotonic()
        if reading.exception() is not None:
            logger.error("could not read the apps' published API keys; the last ones read apply",
                         exc_info=reading.exception())
        else:
            self._bounds = reading.result()
