"""A replica lost under a request (its node died, its process was killed) costs the client a retry or an error in
the API's shape, never a plain-text 500 or a stream cut without an end: ASGI middleware for Serve's proxy.

When the replica a request went to dies, Serve's proxy ends the call without a response (the server then
answers a plain-text `500 Internal Server Error`) or, once a stream has started, without its end (the client
sees the connection cut). Around the proxy's app:
- a request whose response has not started is sent again, once, when its body was small enough to keep
  (REPLAY_BYTES): Serve's router has learned that the replica died, so it goes to another; otherwise it gets a
  503 in OpenAI's shape with `Retry-After`;
- a stream that started and ends without its end gets the API's own error event (chat, completions and
  /generate: `data: {"error": ...}` then `data: [DONE]`; Responses: an `error` event; Anthropic's Messages: an
  `error` event), then its end.
How soon that happens is how soon Ray declares the replica dead: at once for a process that exits, and for a
node that stops answering, after the raylet's missed health checks (`health_check_period_ms` times
`health_check_failure_threshold`, 3 s x 5 by default; the KubeRay manifests set 1 s x 3).

It runs in Serve's proxy (deployments/http/proxy/middlewares.py); behind HAProxy the client's connection is the ingress
replica's own, and a lost ingress replica is HAProxy's to route around. Requests that create stored objects
(files, uploads, batches) are not sent again: a lost replica may have created one already.
"""

import json

from deployments.errors import error_body

REPLAY_BYTES = 1 << 20  # bodies up to this size are kept to be sent again (chat requests are far smaller)
NOT_REPLAYED = ("/v1/files", "/v1/uploads", "/v1/batches")  # they create stored objects
LOST = "the replica serving this request was lost; retry the request"


class LostReplicaGuard:
    def __init__(self, app, replay_bytes: int = REPLAY_BYTES):
        self.app = app
        self.replay_bytes = replay_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = _KeptBody(receive, self.replay_bytes)
        response = _Response(send, body.forget)
        try:
            await self.app(scope, body.receive, response.send)
        except Exception:  # the proxy's own failure: the same as a response it never finished
            pass
        if body.disconnected:
            return  # the client left: nothing to answer
        if not response.started and body.replayable and not scope["path"].startswith(NOT_REPLAYED):
            try:
                await self.app(scope, body.replay(), response.send)
            except Exception:
                pass
        if not response.started:
            await _send_json(send, 503, error_body(503, LOST), [(b"retry-after", b"1")])
        elif not response.ended:
            await response.end_in_shape(scope["path"])


class _KeptBody:
    """The request's body messages as the app reads them, kept (up to a size) to be read again."""

    def __init__(self, receive, limit: int):
        self._receive = receive
        self._limit = limit
        self._messages: list[dict] = []
        self._size = 0
        self.complete = False
        self.disconnected = False

    @property
    def replayable(self) -> bool:
        return self.complete and self._size <= self._limit

    async def receive(self) -> dict:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
        elif message["type"] == "http.request" and self._size <= self._limit:
            self._size += len(message.get("body", b""))
            self._messages.append(message)
            self.complete = not message.get("more_body", False)
        return message

    def forget(self) -> None:
        """The response started: the body is never sent again."""
        self._messages, self._limit = [], -1

    def replay(self):
        """A `receive` that gives the kept body again, then waits on the client's own (its disconnect)."""
        pending = list(self._messages)

        async def receive() -> dict:
            return pending.pop(0) if pending else await self._receive()
        return receive


class _Response:
    """What was sent of the response: started, ended, and whether it is a stream of events."""

    def __init__(self, send, on_start):
        self._send = send
        self._on_start = on_start
        self.started = self.ended = self.events = False

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self._on_start()
            self.events = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                              for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def end_in_shape(self, path: str) -> None:
        """End a response whose replica was lost mid-way: a stream with the API's error event."""
        tail = b""
        if self.events:
            tail = _error_events(path).encode()
        await self._send({"type": "http.response.body", "body": tail, "more_body": False})
        self.ended = True


def _error_events(path: str) -> str:
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "overloaded_error", "message": LOST}}
        return f"event: error\ndata: {json.dumps(body)}\n\n"
    if path.startswith("/v1/responses"):
        body = {"type": "error", "code": "server_error", "message": LOST, "param": None}
        return f"event: error\ndata: {json.dumps(body)}\n\n"
    return f"data: {json.dumps(error_body(503, LOST))}\n\ndata: [DONE]\n\n"


async def _send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
