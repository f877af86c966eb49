"""A replica lost under a request (deployments/http/proxy/lost_replicas.py): the guard's own logic around an app that
behaves as Serve's proxy does when the replica it called dies (it returns without a response, or without the
end of one it started), driven by ASGI calls. Served end to end (a node killed under load on a multi-node
cluster): tests/reliability/multinode_cluster.py."""

import asyncio
import json

import pytest

from deployments.http.proxy.lost_replicas import LostReplicaGuard

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _serve(app, path: str = "/v1/chat/completions", body: bytes = json.dumps(CHAT).encode(),
           chunk: int = 1 << 16) -> tuple[list[dict], bytes]:
    """One request through the guard; the messages the client got and the body they carried."""
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    incoming = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent = []

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    asyncio.run(LostReplicaGuard(app)(scope, receive, send))
    return sent, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def _read_body(receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


class _Replicas:
    """The proxy's app: each call reads the whole body; the first `lost` calls' replicas die (before the response,
    or after `events_before_loss` events of a stream), the next ones answer."""

    def __init__(self, lost: int, events_before_loss: int | None = None, stream: bool = False,
                 media_type: bytes = b"text/event-stream"):
        self.lost, self.events_before_loss, self.stream, self.media_type = lost, events_before_loss, stream, media_type
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        self.bodies.append(await _read_body(receive))
        dies = len(self.bodies) <= self.lost
        if dies and self.events_before_loss is None:
            return  # Serve's proxy when the replica died before answering
        content_type = self.media_type if self.stream else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        if not self.stream:
            await send({"type": "http.response.body", "body": b'{"ok": true}', "more_body": False})
            return
        for i in range(3 if not dies else self.events_before_loss):
            await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(), "more_body": True})
        if not dies:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def test_a_whole_response_passes_unchanged_and_the_app_runs_once():
    for stream in (False, True):
        app = _Replicas(lost=0, stream=stream)
        sent, body = _serve(app)
        assert len(app.bodies) == 1 and sent[0]["status"] == 200
        assert body == (b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n" if stream else b'{"ok": true}')
        assert sent[-1]["more_body"] is False and sum(not m.get("more_body", False) for m in sent[1:]) == 1


def test_a_request_whose_replica_was_lost_before_it_answered_is_sent_again_with_the_same_body():
    app = _Replicas(lost=1)
    body = json.dumps({**CHAT, "padding": "x" * 200_000}).encode()
    sent, answer = _serve(app, body=body, chunk=50_000)  # a body in several messages
    assert app.bodies == [body, body]
    assert sent[0]["status"] == 200 and answer == b'{"ok": true}'


@pytest.mark.parametrize("case", ["lost twice", "body too big to keep", "creates a stored object"])
def test_otherwise_the_client_gets_a_503_in_openais_shape_with_retry_after(case):
    lost, body, path = 1, json.dumps(CHAT).encode(), "/v1/chat/completions"
    if case == "lost twice":
        lost = 2
    elif case == "body too big to keep":
        body = b"x" * ((1 << 20) + 1)
    else:
        path = "/v1/batches"
    app = _Replicas(lost=lost)
    sent, answer = _serve(app, path=path, body=body)
    assert len(app.bodies) == (2 if case == "lost twice" else 1)
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 503 and headers[b"content-type"] == b"application/json"
    assert headers[b"retry-after"] == b"1" and int(headers[b"content-length"]) == len(answer)
    error = json.loads(answer)["error"]
    assert error["type"] == "service_unavailable_error" and "lost" in error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses",
                                  "/v1/messages"])
def test_a_stream_whose_replica_was_lost_ends_with_the_apis_error_event(path):
    app = _Replicas(lost=1, events_before_loss=2, stream=True)
    sent, body = _serve(app, path=path)
    assert len(app.bodies) == 1  # a started response is never sent again
    events = body.decode().split("\n\n")
    assert events[:2] == ["data: 0", "data: 1"] and events[-1] == ""
    assert sent[-1] == {"type": "http.response.body", "body": sent[-1]["body"], "more_body": False}
    if path == "/v1/messages":
        assert events[2].startswith("event: error\ndata: ")
        assert json.loads(events[2].split("data: ", 1)[1])["error"]["type"] == "overloaded_error"
    elif path == "/v1/responses":
        assert events[2].startswith("event: error\ndata: ")
        assert json.loads(events[2].split("data: ", 1)[1])["type"] == "error"
    else:
        assert json.loads(events[2][len("data: "):])["error"]["type"] == "service_unavailable_error"
        assert events[3] == "data: [DONE]"


def test_a_started_response_that_is_not_a_stream_is_ended_as_it_is():
    app = _Replicas(lost=1, events_before_loss=1, stream=True, media_type=b"application/x-ndjson")
    sent, body = _serve(app)
    assert body == b"data: 0\n\n" and sent[-1]["more_body"] is False and len(app.bodies) == 1


def test_a_client_that_left_gets_nothing_more():
    sent = []

    async def app(scope, receive, send):
        await receive()
        await receive()  # the disconnect: the proxy stops

    async def main():
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}, {"type": "http.disconnect"}]

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)
        await LostReplicaGuard(app)({"type": "http", "path": "/v1/chat/completions", "headers": []}, receive, send)

    asyncio.run(main())
    assert sent == []


def test_in_serves_proxy_a_stalled_client_is_let_go_before_the_guard_would_write_to_it():
    """Serve wraps its proxy in `proxy_middlewares()` in order, the last outermost: the stall guard must be outside
    the lost-replica guard, whose error event to a client that reads nothing would otherwise wait forever."""
    from deployments.http.proxy import proxy_middlewares
    from deployments.http.stalled_streams import StalledStreamGuard

    async def proxy(scope, receive, send):  # a stream until its client is gone, then no end: as Serve's proxy
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass

    app = proxy
    for middleware in proxy_middlewares():  # as Serve applies them
        app = middleware.cls(app, **({"stall_s": 0.2} if middleware.cls is StalledStreamGuard else {}))
    written = []

    async def main():
        body = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive():
            if body:
                return body.pop(0)
            await asyncio.Event().wait()  # the client never closes

        async def send(message):  # the client reads the status line, then nothing
            if written:
                await asyncio.Event().wait()
            written.append(message)

        await asyncio.wait_for(app({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []},
                                   receive, send), 5)

    asyncio.run(main())
    assert [m["type"] for m in written] == ["http.response.start"]
