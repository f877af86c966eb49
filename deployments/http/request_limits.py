"""Bounds on what a request's headers and body may cost before a route sees them.

Headers: more than `max_headers` of them, or more than `max_header_bytes` in all, is a 431 before anything
else runs. Body: a client must keep up `min_body_bytes_per_s` on average after a grace of `body_grace_s` seconds
from the request's arrival (a body of B bytes is due within grace + B / rate), else the request ends with a 408
and its connection closes. The rule bounds a sender that trickles a byte at a time and one that stops sending
alike; a real client on a slow link sends far faster than the rate. A request that waited past its grace before
anything read its body (its key's turn: key_admission.py) has LATE_READ_S from the first read, where a body
already sent arrives at once: a slow sender's wait for its turn does not renew its grace. Behind Serve's Python
proxy, a request arrives when the proxy took it (`ARRIVED_AT`, proxy_admission.py), not when it reached the app.
"""

import json
import time

import anyio

from deployments.errors import error_body

LATE_READ_S = 1.0
ARRIVED_AT = "rayllm_arrived_at"  # the scope's key: wall-clock seconds (the proxy and the app share no clock)


class _BodyTooSlow(Exception):
    pass


class RequestLimits:
    """ASGI middleware: header bounds (431) and a minimum body rate (408); see the module's docstring."""

    def __init__(self, app, max_headers: int, max_header_bytes: int, body_grace_s: float,
                 min_body_bytes_per_s: int):
        self.app = app
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.grace = body_grace_s
        self.rate = min_body_bytes_per_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope["headers"]
        if len(headers) > self.max_headers or sum(len(k) + len(v) for k, v in headers) > self.max_header_bytes:
            return await _refuse(send, 431, f"request headers are over {self.max_headers} headers or "
                                            f"{self.max_header_bytes} bytes in all")
        arrived, started_reading, received, complete, responded = _arrival(scope), None, 0, False, False

        async def paced_receive():
            nonlocal started_reading, received, complete
            if complete:
                return await receive()
            now = time.monotonic()
            started_reading = started_reading or now
            due = max(arrived + self.grace, started_reading + LATE_READ_S) + received / self.rate
            with anyio.move_on_after(max(due - now, 0)) as waited:
                message = await receive()
            if waited.cancelled_caught:
                raise _BodyTooSlow
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
            return message

        async def noting_send(message):
            nonlocal responded
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, paced_receive, noting_send)
        except _BodyTooSlow:
            if not responded:
                await _refuse(send, 408, f"the request body came slower than {self.rate} bytes/s after "
                                         f"{self.grace:g} s from the request's arrival; send it faster", close=True)


async def _refuse(send, status: int, message: str, close: bool = False) -> None:
    await send_json(send, status, error_body(status, message), [(b"connection", b"close")] if close else [])


async def send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole JSON response, sent by an ASGI middleware before (or instead of) the app."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _arrival(scope) -> float:
    """When the request arrived, on this process's monotonic clock: now, or when the proxy stamped it."""
    now = time.monotonic()
    stamped = scope.get(ARRIVED_AT)
    return now if stamped is None else now - max(time.time() - stamped, 0.0)
