"""The fleet changes shape under load: a scale-down (two model replicas to one) and then a redeploy (a new engine
option: every replica, and the ingress, replaced), each under 50 live streams, with a batch running through both.
A replica Serve stops takes no new request and serves the ones it has up to its `graceful_shutdown_timeout_s`;
what is left then ends with the API's error event. So no stream is cut without an end, no stream ends with an
error before the bound has passed (every one that could finish did), and the batch completes with each line's
answer once."""

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from ray import serve

from deployments import build_openai_app
from tests.conftest import ENGINE_KWARGS, MODEL_ID, app_args
from tests.deployments.batch.test_batches import chat_line, finished, jsonl, read_jsonl

pytestmark = pytest.mark.reliability
APP = "drain"
STREAMS = 50
BOUND_S = 4.0  # short, so that the long streams outlast it and end with the error event
SHORT, LONG = 24, 2000  # max_tokens: most streams finish within the bound, every fifth cannot
BATCH_LINES = 2000


def _args(server, storage: str, num_replicas: int, **engine_kwargs) -> dict:
    args = app_args(server.model_dir, storage)
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "max_model_len": 2048, **engine_kwargs}
    args["llm_configs"][0]["deployment_config"] = {"num_replicas": num_replicas,
                                                   "graceful_shutdown_timeout_s": BOUND_S}
    args["ingress_deployment_config"] = {"num_replicas": 1}
    return args


def _deploy(args: dict) -> None:
    serve.run(build_openai_app(args), name=APP, route_prefix=f"/{APP}")


async def _stream(http: httpx.AsyncClient, url: str, i: int, started: asyncio.Event, counter: list) -> dict:
    """One chat stream's outcome: done (a finish reason, then [DONE]), error (the error event, then its end) or cut
    (anything else), and when it ended."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": f"stream {i}"}], "stream": True,
            "max_tokens": LONG if i % 5 == 0 else SHORT, "ignore_eos": True}
    events, first = [], True
    try:
        async with http.stream("POST", url, json=body) as reply:
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if first:
                    first = False
                    counter[0] += 1
                    if counter[0] == STREAMS:
                        started.set()
    except httpx.HTTPError as e:
        return {"outcome": "cut", "why": repr(e), "ended": time.monotonic()}
    ended = time.monotonic()
    if first:  # answered without a stream: the request was refused, not cut
        return {"outcome": "cut", "why": "no event", "ended": ended}
    if events[-1] != "[DONE]":
        return {"outcome": "cut", "why": f"ends with {events[-1][:80]}", "ended": ended}
    last = json.loads(events[-2])
    if "error" in last:
        return {"outcome": "error", "why": last["error"]["message"], "ended": ended}
    finishes = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])
                if c.get("finish_reason")]
    return {"outcome": "done" if finishes == ["length"] else "cut", "why": str(finishes), "ended": ended}


def _under_streams(base: str, change) -> tuple[float, list[dict]]:
    """STREAMS streams started; once each has its first event, `change()` runs (on a thread: it blocks until Serve
    has the new shape); returns when it ran and every stream's outcome."""
    async def main():
        started, counter = asyncio.Event(), [0]
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=30),
                                     limits=httpx.Limits(max_connections=STREAMS + 10)) as http:
            tasks = [asyncio.create_task(_stream(http, f"{base}/v1/chat/completions", i, started, counter))
                     for i in range(STREAMS)]
            await asyncio.wait_for(started.wait(), timeout=120)
            changed_at = time.monotonic()
            change_done = threading.Event()
            threading.Thread(target=lambda: (change(), change_done.set()), daemon=True).start()
            outcomes = await asyncio.gather(*tasks)
        await asyncio.to_thread(change_done.wait, 300)
        assert change_done.is_set()
        return changed_at, outcomes

    return asyncio.run(main())


def _check(phase: str, changed_at: float, outcomes: list[dict]) -> None:
    counts = {kind: sum(o["outcome"] == kind for o in outcomes) for kind in ("done", "error", "cut")}
    early = [o for o in outcomes if o["outcome"] == "error" and o["ended"] < changed_at + BOUND_S]
    print(json.dumps({"reliability": "drain", "phase": phase, **counts, "errors_before_bound": len(early),
                      "why": sorted({o["why"] for o in outcomes if o["outcome"] != "done"})[:4]}))
    assert counts["cut"] == 0
    assert early == []  # a stream ended with an error only once the bound had passed
    assert counts["done"] >= STREAMS * 4 // 5  # the short ones (at least) ran to their end


def test_scale_down_and_redeploy_under_streams_and_a_batch(server, tmp_path):
    storage = f"file://{tmp_path}"
    _deploy(_args(server, storage, num_replicas=2))
    base = f"{server.base_url}/{APP}"
    client = openai.Client(base_url=f"{base}/v1", api_key="None", max_retries=0)
    try:
        lines = [chat_line(f"line-{i}", f"batch question {i}", max_tokens=48) for i in range(BATCH_LINES)]
        upload = client.files.create(file=("drain.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")

        running = []

        def change(**options):
            running.append(client.batches.retrieve(batch.id).status == "in_progress")
            _deploy(_args(server, storage, **options))

        _check("scale-down", *_under_streams(base, lambda: change(num_replicas=1)))
        _check("redeploy", *_under_streams(base, lambda: change(num_replicas=1, max_num_seqs=48)))
        assert running == [True, True]  # the batch ran across both

        batch = finished(client, batch.id)
        counts = batch.request_counts
        assert (batch.status, counts.completed, counts.failed) == ("completed", BATCH_LINES, 0), batch
        results = read_jsonl(client, batch.output_file_id)
        ids = [r["custom_id"] for r in results]
        assert len(ids) == len(set(ids)) == BATCH_LINES and set(ids) == {line["custom_id"] for line in lines}
        assert all(r["response"]["status_code"] == 200 for r in results)
    finally:
        serve.delete(APP)
