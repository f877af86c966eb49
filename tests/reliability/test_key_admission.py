"""One key's load does not hold up another's, through Serve: key A's backlog waits at the ingress, not in the
model's queue (past its bounds, 429s), and A's slow senders are cut at the body's minimum rate, while key B's
4-token chat is answered within NORMAL_BOUND_S (two cores) and A's admitted work still completes. Figures are
printed as JSON lines."""

import asyncio
import concurrent.futures
import json
import socket
import time

import httpx
import pytest
import requests
from ray import serve

from deployments.app_config import replica_name
from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args

pytestmark = pytest.mark.reliability
NORMAL_BOUND_S = 1.0
KEYS = ["sk-a", "sk-b"]


def _small_chat(base_url: str) -> tuple[requests.Response, float]:
    start = time.monotonic()
    reply = requests.post(f"{base_url}/v1/chat/completions", timeout=120, headers={"Authorization": "Bearer sk-b"},
                          json={"model": MODEL_ID, "max_tokens": 4, "ignore_eos": True,
                                "messages": [{"role": "user", "content": "hi"}]})
    return reply, time.monotonic() - start


def _streams(base_url: str, count: int, max_tokens: int) -> list[tuple[int, int]]:
    """`count` concurrent streamed chats with key A: (status, completion tokens) each."""
    async def one(client):
        body = {"model": MODEL_ID, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": "a story"}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            lines = [line async for line in reply.aiter_lines() if line.startswith("data: {")]
        return reply.status_code, json.loads(lines[-1][len("data: "):])["usage"]["completion_tokens"]

    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=600, headers={"Authorization": "Bearer sk-a"},
                                     limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(*(one(client) for _ in range(count)))

    return asyncio.run(main())


def test_a_key_with_more_streams_than_a_replica_takes_does_not_hold_up_another_key(server, tmp_path):
    """300 streams from A are more than the replica's 256 seats: without admission by key, what is over waits in
    Serve's first-come queue ahead of B's chat. A's streams past its 64 in flight wait at the ingress. B's
    chats, three one after another, are answered in a median within the bound (the first may meet a wave of A's
    prefills on the two cores)."""
    args = {**app_args(server.model_dir, f"file://{tmp_path}"), "api_key": KEYS, "max_requests_per_key": 64,
            "max_waiting_per_key": 1000}  # all of A's streams wait their turn: none is refused
    with another_app(server, "keys", args) as base_url:
        stats = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="keys").stats
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            streams = pool.submit(_streams, base_url, 300, 64)
            wait_until(lambda: stats.remote().result()["num_running"] >= 64, timeout=120, every=0.05)
            chats = [_small_chat(base_url) for _ in range(3)]
            running = stats.remote().result()["num_running"]
            small, small_s = sorted(chats, key=lambda c: c[1])[1]  # the median of three
            results = streams.result()
    print(json.dumps({"reliability": "key_admission", "small_chats_s": [round(c[1], 3) for c in chats],
                      "a_running_when_answered": running}))
    assert all(c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 4 for c, _ in chats), small.text
    assert results == [(200, 64)] * 300
    assert small_s <= NORMAL_BOUND_S


def test_slow_senders_with_a_valid_key_are_cut_at_the_minimum_rate_and_do_not_hold_up_another_key(server, tmp_path):
    """300 connections with key A each announce a 10 MB body and send a byte a second. A's bounds (8 in flight,
    8 waiting) refuse most at once with a 429; those admitted are cut with a 408 when they fall below the
    minimum rate after the grace; B's chat meanwhile is answered in time, and no connection outlives its bound."""
    grace = 2.0
    args = {**app_args(server.model_dir, f"file://{tmp_path}"), "api_key": KEYS, "body_grace_s": grace,
            "max_requests_per_key": 8, "max_waiting_per_key": 8}
    with another_app(server, "slow", args) as base_url:
        host, port = base_url.removeprefix("http://").split("/")[0].split(":")
        head = (f"POST /slow/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sk-a\r\n"
                f"Content-Type: application/json\r\nContent-Length: {10 << 20}\r\n\r\n{{").encode()
        connections = []
        for _ in range(300):
            connection = socket.create_connection((host, int(port)))
            connection.sendall(head)
            connection.setblocking(False)
            connections.append(connection)
        start = time.monotonic()
        statuses, open_ = {}, set(range(len(connections)))
        small = small_s = refused_s = None
        while open_ and time.monotonic() - start < 4 * grace + 30:
            if small is None and len(statuses) >= 300 - 16:  # all but those admitted refused: B's chat now
                small, small_s = _small_chat(base_url)
                refused_s = time.monotonic() - start
            for i in list(open_):
                try:
                    data = connections[i].recv(65536)
                except BlockingIOError:
                    try:
                        connections[i].send(b" ")  # a byte a second from each connection still open
                    except OSError:
                        open_.discard(i)
                    continue
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 "):
                    statuses[i] = int(data[9:12])
                if not data:
                    open_.discard(i)
            time.sleep(1)
        last_closed_s = time.monotonic() - start
        for connection in connections:
            connection.close()
    counts = {status: list(statuses.values()).count(status) for status in sorted(set(statuses.values()))}
    print(json.dumps({"reliability": "slow_senders", "refused_s": round(refused_s, 1),
                      "small_chat_s": small_s and round(small_s, 3), "statuses": counts,
                      "last_closed_s": round(last_closed_s, 1), "still_open": len(open_)}))
    assert small is not None and small.status_code == 200 and small_s <= NORMAL_BOUND_S, small_s
    assert open_ == set() and set(counts) == {408, 429} and len(statuses) == 300
