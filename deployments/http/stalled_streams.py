"""A client that stops reading a response is let go: ASGI middleware that bounds how long one write to the client
may wait (`RAYLLM_STREAM_STALL_S`, 60 s by default: a real client that reads at all never comes near it).

When a write waits that long, the response is abandoned: nothing more is written, and the app's `receive` answers
`http.disconnect`, so the request is dropped upstream as for a client that closed (its engine request aborted,
its KV blocks freed). What the stream holds meanwhile is bounded by the socket's buffers and what the engine
generates within the bound, not by the length of the response.

Where it runs:
- HAProxy / direct ingress (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`, the manifests' mode): the app writes to the
  client's connection itself, so the app's own middleware (deployments/http/app.py) does it.
- Serve's Python proxy (plain `serve run`): the proxy writes to the client and the app's writes never wait, so
  the proxy must run it (deployments/http/proxy/middlewares.py). Without it nothing limits such a stream but the engine
  finishing it.
"""

import asyncio
import os

STALL_S = float(os.environ.get("RAYLLM_STREAM_STALL_S", "60"))
_DISCONNECT = {"type": "http.disconnect"}


class StalledStreamGuard:
    """ASGI middleware: a write that waits `stall_s` abandons the response and disconnects the app."""

    def __init__(self, app, stall_s: float = STALL_S):
        self.app = app
        self.stall_s = stall_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        stalled = asyncio.Event()

        async def bounded_send(message):
            if stalled.is_set():
                return  # abandoned: the rest of the response goes nowhere
            try:
                async with asyncio.timeout(self.stall_s):  # a timer on this task: no task made per write
                    await send(message)
            except TimeoutError:
                stalled.set()

        async def receive_or_stall():
            if stalled.is_set():
                return _DISCONNECT
            received, stall = asyncio.ensure_future(receive()), asyncio.ensure_future(stalled.wait())
            try:
                await asyncio.wait({received, stall}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # whichever is left, and both when the app stops waiting
                stall.cancel()
                answered = received.done()
                if not answered:
                    received.cancel()
            return received.result() if answered else _DISCONNECT

        await self.app(scope, receive_or_stall, bounded_send)
