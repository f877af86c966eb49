"""Admission by key in Serve's proxy (deployments/http/proxy/admission.py), driven by ASGI calls around an app that
holds each request until the test lets it go; the app's body rule counting from the proxy's stamp
(deployments/http/request_limits.py). Served end to end (a key's 1,500 slow senders beside another key's chat):
tests/reliability/test_key_admission.py."""

import asyncio
import json
import time

from deployments.http.auth import key_digest
from deployments.http.proxy.admission import ProxyKeyAdmission
from deployments.http.request_limits import ARRIVED_AT, RequestLimits


def _scope(key: str | None, method: str = "POST") -> dict:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return {"type": "http", "method": method, "path": "/v1/chat/completions", "headers": headers}


async def _empty_body():
    return {"type": "http.request", "body": b"", "more_body": False}


class _HeldApp:
    """An app that notes each request it takes (its scope) and answers once the test releases it."""

    def __init__(self):
        self.entered: list[dict] = []
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send):
        self.entered.append(scope)
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def _call(middleware, scope) -> list[dict]:
    sent = []

    async def send(message):
        sent.append(message)

    await middleware(scope, _empty_body, send)
    return sent


def test_a_published_key_past_its_bounds_waits_unrouted_or_is_refused_and_other_requests_pass():
    reads = []

    def read_bounds():
        reads.append(time.monotonic())
        return {key_digest("sk-a"): (2, 1)}

    async def main():
        app = _HeldApp()
        proxy = ProxyKeyAdmission(app, read_bounds=read_bounds)  # read by the first request, all of them waiting
        a = [asyncio.create_task(_call(proxy, _scope("sk-a"))) for _ in range(5)]
        others = [asyncio.create_task(_call(proxy, scope)) for scope in
                  (_scope("sk-b"), _scope(None), _scope("sk-a", method="GET"))]
        while len(app.entered) < 5:  # A's two in flight, then B's, the keyless one and A's GET
            await asyncio.sleep(0)
        refused = [await task for task in a[3:]]  # past A's one waiting: answered at once, the app never saw them
        assert len(app.entered) == 5 and not a[2].done()
        app.release.set()
        answered = [await task for task in a[:3] + others]
        return app.entered, refused, answered, app.entered[-1][ARRIVED_AT]

    entered, refused, answered, held_arrival = asyncio.run(asyncio.wait_for(main(), 10))
    assert len(reads) == 1
    assert len(entered) == 6  # A's waiting request reached the app once one of A's two finished
    assert [s["headers"] for s in entered].count(_scope("sk-a")["headers"]) == 4  # A's 3 POSTs and its GET
    assert held_arrival < time.time() and all(ARRIVED_AT in s for s in entered)
    for sent in refused:
        assert sent[0]["status"] == 429 and (b"retry-after", b"1") in sent[0]["headers"]
        error = json.loads(sent[1]["body"])["error"]
        assert error["code"] == "rate_limit_exceeded" and "2 requests in progress and 1 waiting" in error["message"]
    assert [sent[0]["status"] for sent in answered] == [200] * 6


def test_without_published_keys_nothing_is_held():
    async def main():
        app = _HeldApp()
        proxy = ProxyKeyAdmission(app, read_bounds=dict)
        tasks = [asyncio.create_task(_call(proxy, _scope("sk-a"))) for _ in range(50)]
        while len(app.entered) < 50:
            await asyncio.sleep(0)
        app.release.set()
        return [(await task)[0]["status"] for task in tasks]

    assert asyncio.run(asyncio.wait_for(main(), 10)) == [200] * 50


def test_the_body_grace_counts_from_the_proxys_stamp_not_from_reaching_the_app():
    """A body that comes 1.5 s after the app starts reading: within a 3 s grace counted from reaching the app, late
    for one counted from a proxy stamp 10 s earlier (then the first read has LATE_READ_S, 1 s)."""
    async def body_after_1_5_s():
        await asyncio.sleep(1.5)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def status(stamp: float | None) -> int:
        async def app(scope, receive, send):
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        sent = []

        async def send(message):
            sent.append(message)

        scope = _scope("sk-a") | ({ARRIVED_AT: stamp} if stamp else {})
        limits = RequestLimits(app, max_headers=64, max_header_bytes=1 << 16, body_grace_s=3.0,
                               min_body_bytes_per_s=1024)
        await limits(scope, body_after_1_5_s, send)
        return sent[0]["status"]

    assert asyncio.run(status(None)) == 200
    assert asyncio.run(status(time.time() - 10)) == 408
