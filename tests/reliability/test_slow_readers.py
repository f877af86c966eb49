"""Readers that never read (issue 47, item 3): long streams at the logprob cap whose clients read nothing, through
Serve's Python proxy, which conftest starts with the stall guard (deployments/http/stalled_streams.py). Once a
write to such a client has waited the stall bound, the proxy lets it go: its request is aborted long before its
tokens would have ended, the connection is closed after what the socket buffers held, and the proxy's and the
replica's memory comes back. Another chat stays fast meanwhile. The figures are printed as one JSON line."""

import json
import socket
import time

import openai
import psutil
import pytest
from ray import serve

from deployments.app_config import replica_name
from testing.helpers import wait_until
from testing.model_factory import build_model_dir
from tests.conftest import MODEL_ID, PROXY_ENV, another_app, app_args

pytestmark = pytest.mark.reliability
STALL_S = float(PROXY_ENV["RAYLLM_STREAM_STALL_S"])
# long enough that the engine is still generating when the stall bound lets a reader go (the test asserts it)
READERS, MAX_TOKENS = 4, 30000


@pytest.fixture(scope="module")
def long_app(server, tmp_path_factory):
    """An app whose model streams for minutes: 30,000 tokens a request."""
    model_dir = build_model_dir(tmp_path_factory.mktemp("long"), "qwen2", max_positions=32768)
    args = app_args(model_dir, f"file://{tmp_path_factory.mktemp('long-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {"max_model_len": 32768, "kv_cache_bytes": 512 << 20}
    with another_app(server, "long", args) as url:
        yield url


def _proxy_rss() -> int:
    """The resident memory of Serve's proxy (its process titles itself `ray::ProxyActor`)."""
    (proxy,) = [p for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [""])[0].startswith("ray::ProxyActor")]
    return proxy.memory_info().rss


def _open_unread_stream(port: int) -> socket.socket:
    """A chat stream at the logprob cap, its answer never read (a 4 KiB receive buffer, soon full)."""
    body = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "story"}],
                       "max_tokens": MAX_TOKENS, "ignore_eos": True, "logprobs": True, "top_logprobs": 20,
                       "stream": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /long/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _drain(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server still sends, and whether it then closed the connection."""
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except TimeoutError:
        return data, False
    finally:
        sock.close()
    return data, True


def test_readers_that_never_read_are_let_go_and_memory_comes_back(server, long_app):
    port = int(server.base_url.rsplit(":", 1)[1])
    client = openai.Client(base_url=f"{long_app}/v1", api_key="None", max_retries=0)
    client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "warm"}], max_tokens=4)
    replica = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="long")

    def replica_stats() -> dict:
        return replica.stats.remote().result()

    proxy_before, replica_before = _proxy_rss(), replica_stats()["rss_bytes"]
    opened = time.monotonic()
    readers = [_open_unread_stream(port) for _ in range(READERS)]
    wait_until(lambda: replica_stats()["num_requests"] == READERS, 30, every=0.2)
    start = time.monotonic()
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, extra_body={"ignore_eos": True})
    other_chat_s = time.monotonic() - start
    proxy_peak = _proxy_rss()
    wait_until(lambda: replica_stats()["num_requests"] == 0, STALL_S + 120, every=0.5)
    ended_s = time.monotonic() - opened
    assert ended_s >= STALL_S, "the requests ended on their own, before the stall bound: make them longer"
    drained = [_drain(sock) for sock in readers]  # what the socket buffers held for them, then the close
    after = {}

    def memory_back() -> bool:
        after["proxy"], after["replica"] = _proxy_rss(), replica_stats()["rss_bytes"]
        return after["proxy"] <= 1.1 * proxy_before and after["replica"] <= 1.1 * replica_before

    try:
        back = wait_until(memory_back, 60, every=1)
    except AssertionError:
        back = False
    print(json.dumps({"reliability": "slow_readers", "readers": READERS, "stall_s": STALL_S,
                      "other_chat_s": round(other_chat_s, 3), "requests_ended_after_s": round(ended_s, 1),
                      "bytes_left_per_reader": [len(data) for data, _ in drained],
                      "events_left_per_reader": [data.count(b"data: ") for data, _ in drained],
                      "closed_by_server": [closed for _, closed in drained],
                      "proxy_rss_mb": [proxy_before >> 20, proxy_peak >> 20, after["proxy"] >> 20],
                      "replica_rss_mb": [replica_before >> 20, after["replica"] >> 20]}))
    assert chat.usage.completion_tokens == 4 and other_chat_s < 1.0
    for data, closed in drained:  # cut: let go before its tokens ended, then closed
        assert closed and b"[DONE]" not in data and data.count(b"data: ") < MAX_TOKENS
    assert back, "the proxy's or the replica's memory stayed up"
