"""Batch throughput: a batch through the served app against the offline engine on the same requests.

LINES chat lines (max_tokens 16, ignore_eos, greedy), each a distinct short
question, are uploaded to configs/local.yaml's application (direct streaming,
its replica on every core: benchmarks/online_serving.py's config) on the
tiny Qwen2 model the tests build (tests/model_factory.py), and run as one
batch; its lines/s is LINES over the time from `batches.create` to
`completed` (validation and finalization included). The offline engine
(`runtime.LLM`, same engine options) runs the same conversations at once,
before and after the server (a shared 2-core machine drifts within a run);
the ratio uses their mean.

It also measures the batch manager's process: CPU seconds per line (its
per-line work: reading, parsing, validating, the handle call, serialising)
and RSS after the LINES batch and after a batch BIG_LINES long, which stays
flat when neither input nor output is held whole.

Run: python -m benchmarks.batch_throughput
"""

import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import psutil

from benchmarks.common import report
from benchmarks.online_serving import MODEL_ID, local_config_args
from runtime import LLM, SamplingParams
from tests.helpers import free_port, wait_until
from tests.model_factory import build_model_dir

LINES, BIG_LINES, MAX_TOKENS, WARMUP_LINES = 2000, 10_000, 16, 200


def conversations(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"question {i}: what comes after {i * 7 % 1000}?"}] for i in range(count)]


def batch_file(count: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL_ID, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}})
        + "\n" for i, messages in enumerate(conversations(count))).encode()


def offline_lines_s(path: Path) -> float:
    llm = LLM(str(path), max_model_len=1024)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.chat(conversations(WARMUP_LINES), params)
    start = time.perf_counter()
    outputs = llm.chat(conversations(LINES), params)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)
    llm.shutdown()
    return round(LINES / elapsed, 1)


def manager_process() -> psutil.Process:
    """The batch manager of this run's Ray (the machine may run other people's)."""
    return next(p for p in psutil.Process().children(recursive=True) if p.name().startswith("ray::BatchManager"))


def run_batch(client: openai.Client, count: int) -> dict:
    """One batch of `count` lines, timed from create to completed; the manager's CPU and peak RSS on it."""
    uploaded = client.files.create(file=("batch.jsonl", batch_file(count)), purpose="batch")
    start = time.perf_counter()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    manager = manager_process()
    cpu_before = sum(manager.cpu_times()[:2])
    peak_rss = 0

    def done():
        nonlocal peak_rss
        peak_rss = max(peak_rss, manager.memory_info().rss)
        b = client.batches.retrieve(batch.id)
        return b.status in ("completed", "failed", "cancelled", "expired") and b

    batch = wait_until(done, timeout=1800, every=0.25)
    elapsed = time.perf_counter() - start
    assert batch.status == "completed" and batch.request_counts.completed == count, batch
    return {"lines_s": round(count / elapsed, 1), "seconds": round(elapsed, 2),
            "manager_cpu_ms_per_line": round(1000 * (sum(manager.cpu_times()[:2]) - cpu_before) / count, 3),
            "manager_peak_rss_mib": round(peak_rss / 2**20, 1)}


@contextmanager
def serving(path: Path):
    """configs/local.yaml's application on a fresh Ray; yields its OpenAI base URL. After, waits for this
    Ray's own processes only: the machine may be running other people's."""
    import ray
    from ray import serve

    from deployments import build_openai_app

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app(local_config_args(path, direct_streaming=True)), route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.shutdown()
        ray.shutdown()
        wait_until(lambda: not psutil.Process().children(recursive=True), timeout=60, every=0.5)


def served(path: Path) -> dict:
    with serving(path) as url:
        client = openai.Client(base_url=url, api_key="none", max_retries=0)
        run_batch(client, WARMUP_LINES)
        return {"batch": run_batch(client, LINES), "big_batch": run_batch(client, BIG_LINES)}


def main() -> None:
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="batch-bench-")), "qwen2")
    before = offline_lines_s(path)
    ours = served(path)
    after = offline_lines_s(path)
    engine = (before + after) / 2
    report("batch_throughput", lines=LINES, max_tokens=MAX_TOKENS, served=ours["batch"],
           offline_engine_lines_s_before_after=[before, after],
           served_over_offline=round(ours["batch"]["lines_s"] / engine, 3),
           big_batch={"lines": BIG_LINES, **ours["big_batch"]})


if __name__ == "__main__":
    main()
