"""The reliability suite: sustained load, schema fuzzing, and an object-store outage during a batch.

Run with `python -m pytest -m reliability -s`. Its size comes from the environment:
RELIABILITY_STREAMS (200), RELIABILITY_SECONDS (60), RELIABILITY_FUZZ_EXAMPLES (50); `.ci/run` runs
a bounded form. The figures are printed as JSON lines.
"""

import asyncio
import json
import os
import time

import boto3
import openai
import pytest
import schemathesis

from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args
from tests.deployments.batch.test_batches import chat_line, finished, jsonl, read_jsonl

pytestmark = pytest.mark.reliability
STREAMS = int(os.environ.get("RELIABILITY_STREAMS", 200))
SECONDS = float(os.environ.get("RELIABILITY_SECONDS", 60))
FUZZ_EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", 50))


def test_sustained_concurrent_streams(server):
    client = openai.AsyncClient(base_url=server.openai_url, api_key="None", max_retries=0, timeout=120)
    stats_before = server.engine_stats()
    done, errors, tokens = 0, [], 0

    async def user(i: int, deadline: float):
        nonlocal done, tokens
        while time.monotonic() < deadline:
            try:
                stream = await client.chat.completions.create(
                    model=MODEL_ID, messages=[{"role": "user", "content": f"user {i} asks a question"}],
                    max_tokens=16, stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True})
                async for chunk in stream:
                    if chunk.usage is not None:
                        tokens += chunk.usage.completion_tokens
                done += 1
            except Exception as e:  # any failure is a finding
                errors.append(repr(e))

    async def main():
        deadline = time.monotonic() + SECONDS
        await asyncio.gather(*(user(i, deadline) for i in range(STREAMS)))

    start = time.monotonic()
    asyncio.run(main())
    elapsed = time.monotonic() - start
    stats = server.engine_stats()
    growth = stats["rss_bytes"] - stats_before["rss_bytes"]
    print(json.dumps({"reliability": "load", "streams": STREAMS, "seconds": round(elapsed, 1), "completed": done,
                      "errors": len(errors), "output_tokens": tokens, "replica_rss_mb": stats["rss_bytes"] >> 20,
                      "rss_growth_mb": growth >> 20}))
    assert errors == [] and done >= STREAMS
    assert growth < 512 << 20  # bounded: no per-request leak
    assert stats["num_requests"] == 0 and stats["num_free_blocks"] == stats["num_blocks"]


def test_fuzzed_requests_never_get_a_5xx(server):
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    tried, failures = 0, []
    for operation in schema.get_all_operations():
        op = operation.ok()
        if op.path in ("/v1/batches", "/v1/files"):  # creating thousands of jobs and files is the load test's job
            continue
        strategy = op.as_strategy()

        from hypothesis import HealthCheck, given, settings

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def check(case):
            nonlocal tried
            if isinstance(case.body, dict) and "max_tokens" in case.body:
                case.body["max_tokens"] = min(case.body["max_tokens"] or 1, 8) if isinstance(
                    case.body["max_tokens"], int) and case.body["max_tokens"] > 0 else case.body["max_tokens"]
            response = case.call(base_url=server.base_url, timeout=60)
            tried += 1
            if response.status_code >= 500:
                failures.append((op.method, op.path, response.status_code, response.text[:200], repr(case.body)[:300]))

        check()
    print(json.dumps({"reliability": "fuzz", "cases": tried, "server_errors": len(failures)}))
    assert tried > 0 and failures == []
    assert server.engine_stats()["num_requests"] == 0


def test_object_store_outage_during_a_batch(server, s3_server):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="outage")
    total = 300
    lines = [chat_line(f"o-{i}", f"q {i}", 16) for i in range(total)]
    s3.put_object(Bucket="outage", Key="in.jsonl", Body=jsonl(lines))
    # a few lines at a time, so the batch is still running when the outage starts (the engine's full seats finish
    # 300 lines before the first progress read)
    args = {**app_args(server.model_dir, "s3://outage/state"), "batch_input_prefixes": ["s3://outage/"],
            "batch_concurrency": 8}
    with another_app(server, "outage", args) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        batch = client.batches.create(input_file_id="s3://outage/in.jsonl", endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0)
        before = client.batches.retrieve(batch.id)
        assert before.status == "in_progress" and before.request_counts.completed < total  # the outage hits a run
        s3_server.stop()
        outage_started = time.monotonic()
        time.sleep(10)  # the outage itself: the store is unreachable for 10 seconds
        s3_server.start()
        batch = finished(client, batch.id)
        ids = [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)]
        print(json.dumps({"reliability": "s3_outage", "outage_s": round(time.monotonic() - outage_started, 1),
                          "requests": total, "completed": batch.request_counts.completed,
                          "output_lines": len(ids), "unique": len(set(ids))}))
        assert batch.status == "completed" and sorted(ids) == sorted(f"o-{i}" for i in range(total))
