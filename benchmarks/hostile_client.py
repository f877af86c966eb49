"""A hostile client with a valid key beside another key's ordinary use, on configs/local.yaml's app (Serve's proxy
wrapped as README's operations section says) with two API keys (A: sk-a, B: sk-b) and the tiny test model (what
`python -m testing.model_factory` writes for that config).

Key B's 4-token chats, one after another, alone and beside each of A's loads:
- `streams`: 300 streamed chats of 64 tokens at once;
- `slow_bodies`: 1,500 connections, each declaring a 10 MB body and sending a byte a second (also reported: how
  many are still open after 20 s);
- `batches`: twenty 500-line batches (reported instead: B's 10-line batch, from create to completed, beside them
  and alone).

Where a chat's time goes comes from its trace (the app exports to an OTLP receiver here; B's requests carry a
`traceparent`): `to_http` before the replica's HTTP side took it (Serve's proxy and queue), `http` on the HTTP
side before the engine (body, key admission, template), `engine_first_token` (queued in the engine, prefilled),
`decode`, `after_engine` (the response's last bytes sent) and `back` (to the client).

Run: python -m benchmarks.hostile_client
"""

import asyncio
import concurrent.futures
import io
import json
import logging
import os
import resource
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai
import requests

from benchmarks.batch_throughput import serving_app
from benchmarks.common import report
from benchmarks.online_serving import MODEL_ID, local_config_args
from deployments.app_config import replica_name
from testing.helpers import wait_until
from testing.model_factory import build_model_dir
from testing.otlp_receiver import OtlpReceiver
from testing.slow_senders import open_slow_senders, tick

KEYS = {"a": "sk-a", "b": "sk-b"}
STREAMS, SLOW_CONNECTIONS, BATCHES, BATCH_LINES, B_BATCH_LINES, PROBES = 300, 1500, 20, 500, 10, 5
SLOW_BODY_BYTES, OPEN_AFTER_S = 10 << 20, 20


def local_app(receiver: OtlpReceiver) -> dict:
    """configs/local.yaml's app with the two keys, tracing to `receiver`."""
    model = build_model_dir(Path(tempfile.mkdtemp(prefix="hostile-model-")), "qwen2")
    return {**local_config_args(model, direct_streaming=True), "api_key": list(KEYS.values()),
            "otlp_traces_endpoint": receiver.url}


class Probe:
    """Key B's chats, each traced; `breakdown` splits their time by their spans."""

    def __init__(self, base_url: str, receiver: OtlpReceiver):
        self.base_url, self.receiver = base_url, receiver

    def chat(self) -> dict:
        trace_id = secrets.token_hex(16)
        sent = time.time_ns()
        reply = requests.post(f"{self.base_url}/v1/chat/completions", timeout=300, headers={
            "Authorization": f"Bearer {KEYS['b']}", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
            json={"model": MODEL_ID, "max_tokens": 4, "ignore_eos": True,
                  "messages": [{"role": "user", "content": "hi"}]})
        done = time.time_ns()
        assert reply.status_code == 200, reply.text
        return {"trace_id": trace_id, "sent_ns": sent, "done_ns": done}

    def chats(self, count: int = PROBES) -> list[dict]:
        return [self.chat() for _ in range(count)]

    def breakdown(self, chats: list[dict]) -> dict:
        """Seconds of each chat (the list), the median of each part, and the slowest chat's parts."""
        def spans(chat):
            found = {s["name"]: s for s in self.receiver.spans if s["trace_id"] == chat["trace_id"]}
            return found if {"POST /v1/chat/completions", "llm_request", "prefill", "decode"} <= set(found) else None

        parts = []
        for chat in chats:
            s = wait_until(lambda chat=chat: spans(chat), timeout=60, every=0.5)
            http, engine = s["POST /v1/chat/completions"], s["llm_request"]
            parts.append({"total": chat["done_ns"] - chat["sent_ns"], "to_http": http["start_ns"] - chat["sent_ns"],
                          "http": engine["start_ns"] - http["start_ns"],
                          "engine_first_token": s["prefill"]["end_ns"] - s["prefill"]["start_ns"],
                          "decode": s["decode"]["end_ns"] - s["decode"]["start_ns"],
                          "after_engine": http["end_ns"] - engine["end_ns"], "back": chat["done_ns"] - http["end_ns"]})
        slowest = max(parts, key=lambda p: p["total"])
        return {"chats_s": [round(p["total"] / 1e9, 3) for p in parts],
                "median_parts_s": {k: round(statistics.median(p[k] for p in parts) / 1e9, 3) for k in parts[0]},
                "slowest_parts_s": {k: round(v / 1e9, 3) for k, v in slowest.items()}}


def streams(base_url: str, count: int) -> list[int]:
    """`count` streamed chats from key A at once: each one's status."""
    async def one(client):
        body = {"model": MODEL_ID, "max_tokens": 64, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "a story"}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            async for _ in reply.aiter_bytes():
                pass
        return reply.status_code

    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=600, headers={"Authorization": f"Bearer {KEYS['a']}"},
                                     limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(*(one(client) for _ in range(count)))

    return asyncio.run(main())


def beside_streams(base_url: str, probe: Probe) -> dict:
    stats = _stats()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(streams, base_url, STREAMS)
        wait_until(lambda: stats.remote().result()["num_running"] >= 64, timeout=120, every=0.05)
        chats = probe.chats()
        statuses = load.result()
    return {**probe.breakdown(chats), "a_statuses": {s: statuses.count(s) for s in set(statuses)}}


def beside_slow_bodies(base_url: str, probe: Probe) -> dict:
    """A's connections each declare a 10 MB body and send a byte a second; B's chats go meanwhile (a thread)."""
    connections = open_slow_senders(base_url, "/v1/chat/completions", KEYS["a"], SLOW_CONNECTIONS, SLOW_BODY_BYTES)
    start, open_, statuses, open_at = time.monotonic(), set(range(SLOW_CONNECTIONS)), {}, None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chats = pool.submit(probe.chats)
        while open_ and time.monotonic() - start < 60:
            tick(connections, open_, statuses)
            if open_at is None and time.monotonic() - start >= OPEN_AFTER_S:
                open_at = len(open_)
            time.sleep(1)
        chats = chats.result()
    for connection in connections:
        connection.close()
    answered = list(statuses.values())
    return {**probe.breakdown(chats), f"a_open_after_{OPEN_AFTER_S}s": open_at if open_at is not None else 0,
            "a_statuses": {s: answered.count(s) for s in sorted(set(answered))}}


def batch_s(client: openai.Client, file_id: str) -> float:
    """Seconds from a batch's create to its completion (polled every 0.1 s)."""
    start = time.monotonic()
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == batch.request_counts.total, batch
    return round(time.monotonic() - start, 3)


def batch_file(client: openai.Client, lines: int) -> str:
    body = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL_ID, "max_tokens": 16, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"line {i}"}]}}) + "\n" for i in range(lines))
    return client.files.create(file=("lines.jsonl", io.BytesIO(body.encode())), purpose="batch").id


def beside_batches(base_url: str) -> dict:
    a, b = (openai.Client(base_url=f"{base_url}/v1", api_key=KEYS[k], max_retries=0) for k in "ab")
    b_file = batch_file(b, B_BATCH_LINES)
    alone = batch_s(b, b_file)
    a_file = batch_file(a, BATCH_LINES)
    a_batches = [a.batches.create(input_file_id=a_file, endpoint="/v1/chat/completions", completion_window="24h")
                 for _ in range(BATCHES)]
    wait_until(lambda: a.batches.retrieve(a_batches[-1].id).status == "in_progress", timeout=120, every=0.2)
    beside = batch_s(b, b_file)
    a_done = sum(a.batches.retrieve(x.id).request_counts.completed for x in a_batches)
    for batch in a_batches:
        if a.batches.retrieve(batch.id).status == "in_progress":
            a.batches.cancel(batch.id)
    return {"b_batch_alone_s": alone, "b_batch_beside_s": beside, "a_lines_done_meanwhile": a_done}


def _stats():
    from ray import serve

    return serve.get_deployment_handle(replica_name(MODEL_ID), app_name="default").stats


def main() -> None:
    # Serve's proxy wrapped as README's operations section says (its admission by key among them), before Ray starts
    os.environ["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] = "deployments.http.proxy:proxy_middlewares"
    logging.getLogger("httpx").setLevel(logging.WARNING)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,500 connections, both their ends
    receiver = OtlpReceiver()
    with serving_app(local_app(receiver)) as base_url:
        probe = Probe(base_url, receiver)
        probe.chats(2)  # warm: the first chat compiles and caches what the rest reuse
        report("hostile_client", load="none", cpus=os.cpu_count(), **probe.breakdown(probe.chats()))
        report("hostile_client", load="streams", **beside_streams(base_url, probe))
        report("hostile_client", load="slow_bodies", **beside_slow_bodies(base_url, probe))
        report("hostile_client", load="batches", **beside_batches(base_url))
    receiver.stop()


if __name__ == "__main__":
    main()
