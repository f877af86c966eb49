"""The HTTP edge's bounds on one caller's cost to others, on the app built in-process (no Ray): header limits,
the body's minimum rate, and a key's requests in flight and waiting. tests/reliability/test_key_admission.py
shows them holding under load through Serve."""

import asyncio
import json
import time

import httpx

from deployments.http.request_limits import LATE_READ_S
from tests.deployments.http.test_http_app import CHAT, MODEL, ScriptedModel, serve_in_process


def _scope(path: str, headers: list[tuple[bytes, bytes]], method: str = "POST") -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


async def _call(app, scope, receive) -> tuple[int, dict, bytes]:
    sent = []

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_too_many_or_too_large_headers_are_a_431_in_openai_shape(tmp_path):
    app = serve_in_process(ScriptedModel([]), tmp_path, max_headers=20, max_header_bytes=4096)
    assert app.get("/v1/models", headers={f"x-h{i}": "v" for i in range(15)}).status_code == 200
    for headers in ({f"x-h{i}": "v" for i in range(25)}, {"x-big": "v" * 5000}):
        reply = app.get("/v1/models", headers=headers)
        error = reply.json()["error"]
        assert reply.status_code == 431 and error["type"] == "invalid_request_error" and "headers" in error["message"]


def test_a_body_slower_than_the_minimum_rate_is_a_408_that_closes_the_connection(tmp_path):
    """A sender that stops after its first bytes, and one that trickles, are cut at grace + received / rate;
    a body sent at once passes whatever its size."""
    app = serve_in_process(ScriptedModel([]), tmp_path, body_grace_s=0.3, min_body_bytes_per_s=1000).app
    body = json.dumps(CHAT).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"100000")]

    async def stalled():
        parts = [{"type": "http.request", "body": body[:10], "more_body": True}]

        async def receive():
            if parts:
                return parts.pop()
            await asyncio.Event().wait()  # never sends the rest

        return await _call(app, _scope("/v1/chat/completions", headers), receive)

    async def trickle():
        async def receive():
            await asyncio.sleep(0.05)
            return {"type": "http.request", "body": b" ", "more_body": True}

        return await _call(app, _scope("/v1/chat/completions", headers), receive)

    for sender in (stalled, trickle):
        start = time.monotonic()
        status, response_headers, reply = asyncio.run(sender())
        assert status == 408 and response_headers["connection"] == "close", reply
        assert json.loads(reply)["error"]["type"] == "timeout"
        assert 0.3 <= time.monotonic() - start < 5
    whole = asyncio.run(_call(app, _scope("/v1/chat/completions", [(b"content-type", b"application/json")]),
                              _once({"type": "http.request", "body": body, "more_body": False})))
    assert whole[0] == 200


def _once(message):
    async def receive():
        return message
    return receive


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)


class HeldModel(ScriptedModel):
    """Chats whose last message is "hold" wait until released; others answer at once."""

    def __init__(self):
        super().__init__([])
        self.release = asyncio.Event()
        self.held = 0

    async def chat(self, req, request_id=None, priority=0, owner=None) -> dict:
        if req.messages[-1].content == "hold":
            self.held += 1
            await self.release.wait()
        return await super().chat(req, request_id, priority, owner)


def test_a_key_past_its_requests_in_flight_waits_then_is_refused_while_another_key_goes_straight_through(tmp_path):
    model = HeldModel()
    app = serve_in_process(model, tmp_path, api_key=["sk-a", "sk-b"], max_requests_per_key=4,
                           max_waiting_per_key=2).app  # each of the ingress's two replicas: 2 and 1
    hold = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}]}

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge") as client:
            def post(key, body):
                return client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})

            held = [asyncio.create_task(post("sk-a", hold)) for _ in range(3)]  # two in flight, one waiting
            await asyncio.wait_for(_until(lambda: model.held == 2), timeout=30)
            refused = await post("sk-a", CHAT)
            refused_messages = await client.post("/v1/messages", headers={"x-api-key": "sk-a"}, json={
                "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
            other_key = await post("sk-b", CHAT)
            no_key = await client.post("/v1/chat/completions", json=CHAT)
            assert model.held == 2 and not any(t.done() for t in held)  # the third waits at the edge
            model.release.set()
            return refused, refused_messages, other_key, no_key, await asyncio.gather(*held)

    refused, refused_messages, other_key, no_key, held = asyncio.run(scenario())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == {"message": refused.json()["error"]["message"], "type": "requests",
                                       "param": None, "code": "rate_limit_exceeded"}
    assert refused_messages.status_code == 429 and refused_messages.json()["type"] == "error"  # Anthropic's shape
    assert refused_messages.json()["error"]["type"] == "rate_limit_error"
    assert other_key.status_code == 200 and no_key.status_code == 401
    assert [r.status_code for r in held] == [200, 200, 200] and model.held == 3


def test_a_slow_sender_that_waited_for_its_keys_turn_is_cut_soon_after_its_first_read(tmp_path):
    """The body's grace runs from the request's arrival: a sender that stalls while it waits behind its key's
    requests in flight, past its grace, is cut LATE_READ_S after its body is first read (not a whole grace later);
    a request that waited as long with its body sent is answered."""
    model = HeldModel()
    grace = 3.0
    app = serve_in_process(model, tmp_path, api_key=["sk-a"], max_requests_per_key=4, max_waiting_per_key=4,
                           body_grace_s=grace, min_body_bytes_per_s=1000).app  # per replica: 2 in flight, 2 waiting
    body = json.dumps(CHAT).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"100000"),
               (b"authorization", b"Bearer sk-a")]

    async def stalled():
        parts = [{"type": "http.request", "body": body[:10], "more_body": True}]

        async def receive():
            if parts:
                return parts.pop()
            await asyncio.Event().wait()

        return await _call(app, _scope("/v1/chat/completions", headers), receive)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge",
                                     headers={"Authorization": "Bearer sk-a"}) as client:
            hold = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}]}
            held = [asyncio.create_task(client.post("/v1/chat/completions", json=hold)) for _ in range(2)]
            await asyncio.wait_for(_until(lambda: model.held == 2), timeout=30)
            waiting = [asyncio.create_task(stalled()),
                       asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))]
            await asyncio.sleep(grace + 0.2)  # both wait for their key's turn past the grace
            model.release.set()
            released = time.monotonic()
            cut = await waiting[0]
            return cut, time.monotonic() - released, await waiting[1], await asyncio.gather(*held)

    (status, _, reply), cut_after_s, sent_whole, held = asyncio.run(scenario())
    assert status == 408 and json.loads(reply)["error"]["type"] == "timeout"
    assert LATE_READ_S <= cut_after_s < grace - 0.5, cut_after_s
    assert sent_whole.status_code == 200 and [r.status_code for r in held] == [200, 200]
