"""Batch throughput: a batch through the served app against the offline engine on the same requests.

LINES chat lines (max_tokens 16, ignore_eos, greedy), each a distinct short
question, are uploaded to configs/local.yaml's application (direct streaming,
its replica on every core: benchmarks/online_serving.py's config) on the
tiny Qwen2 model the tests build (testing/model_factory.py), and run as one
batch; its lines/s is LINES over the time from `batches.create` to
`completed` (validation and finalization included). The offline engine
(`runtime.LLM`, same engine options) runs the same conversations at once,
before and after the server (a shared 2-core machine drifts within a run);
the ratio uses their mean. While it runs, the replica's engine is asked for its
running and waiting sequences every 0.1 s: their means say how many of the
engine's seats the batch kept busy (the offline run fills all of them).

It also measures the batch manager's process: CPU seconds per line (its
per-line work: reading, parsing, validating, the handle call, serialising)
and peak RSS over batches of MID_LINES and BIG_LINES (OpenAI's limit), which
stays flat when neither input nor output is held whole; the BIG_LINES output
is read back and every custom_id must be there once. While the big batch
runs, online streaming chats' time to first token is measured against the
same chats on the idle server.

With --replicas N, the LINES batch runs on one replica and then on N (fresh Ray each time, the cores split
evenly between them): a batch should scale with the replicas it is given.

Run: python -m benchmarks.batch_throughput [--lines-only] [--replicas N] [--device cpu|cuda]
  --lines-only   the LINES batch and the offline engine only
  --replicas N   as --lines-only, plus the LINES batch on N replicas against one
  --device       the engine's device, served and offline (default: cuda when there is one)
"""

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import psutil
import torch

from benchmarks.common import report
from benchmarks.online_serving import MODEL_ID, local_config_args
from runtime import LLM, SamplingParams
from testing.helpers import free_port, wait_until
from testing.model_factory import build_model_dir

LINES, MID_LINES, BIG_LINES, MAX_TOKENS, WARMUP_LINES = 2000, 10_000, 50_000, 16, 200
TTFT_PROBES = 20  # sequential streaming chats, idle and during the big batch


def conversations(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"question {i}: what comes after {i * 7 % 1000}?"}] for i in range(count)]


def batch_file(count: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL_ID, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}})
        + "\n" for i, messages in enumerate(conversations(count))).encode()


def offline_lines_s(path: Path, device: str) -> float:
    llm = LLM(str(path), max_model_len=1024, device=device)
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


def ttft_p50_ms(client: openai.Client) -> float:
    """The median time to the first content chunk over TTFT_PROBES sequential streaming chats."""
    ttfts = []
    for i in range(TTFT_PROBES):
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=8, temperature=0,
            stream=True, extra_body={"ignore_eos": True})
        next(c for c in stream if c.choices and c.choices[0].delta.content)
        ttfts.append(time.perf_counter() - start)
        stream.close()
    return round(1000 * statistics.median(ttfts), 1)


@contextmanager
def engine_seats(figures: dict):
    """The replica engine's running and waiting sequences, sampled every 0.1 s while the block runs; their means
    go into `figures` (with several replicas, each sample is of the one the handle routes to: a per-replica mean)."""
    from ray import serve

    from deployments.app_config import replica_name

    replica = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="default")
    samples, stop = [], threading.Event()

    def sample():
        while not stop.wait(0.1):
            stats = replica.stats.remote().result()
            samples.append((stats["num_running"], stats["num_waiting"]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()
        figures.update(engine_running_mean=round(statistics.mean(r for r, _ in samples), 1),
                       engine_waiting_mean=round(statistics.mean(w for _, w in samples), 1))


def run_batch(client: openai.Client, count: int, probe_online: bool = False) -> dict:
    """One batch of `count` lines, timed from create to completed; the manager's CPU and peak RSS on it; with
    `probe_online`, online TTFT while it runs and a check that its output has every custom_id once."""
    uploaded = client.files.create(file=("batch.jsonl", batch_file(count)), purpose="batch")
    start = time.perf_counter()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    manager = manager_process()
    cpu_before = sum(manager.cpu_times()[:2])
    peak_rss, figures = 0, {}

    def probe():  # once lines are coming back, the batch has the replica's capacity
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0, timeout=600)
        figures["online_ttft_p50_ms_during"] = ttft_p50_ms(client)

    prober = threading.Thread(target=probe, daemon=True)
    if probe_online:
        prober.start()

    def done():
        nonlocal peak_rss
        peak_rss = max(peak_rss, manager.memory_info().rss)
        b = client.batches.retrieve(batch.id)
        return b.status in ("completed", "failed", "cancelled", "expired") and b

    # polled every 50 ms: a batch of 2,000 lines takes a second or two, and a coarse poll adds half its period
    # to that on average, enough to blur the comparison of one replica with two
    batch = wait_until(done, timeout=3600, every=0.05)
    elapsed = time.perf_counter() - start
    assert batch.status == "completed" and batch.request_counts.completed == count, batch
    figures.update(lines_s=round(count / elapsed, 1), seconds=round(elapsed, 2),
                   manager_cpu_ms_per_line=round(1000 * (sum(manager.cpu_times()[:2]) - cpu_before) / count, 3),
                   manager_peak_rss_mib=round(peak_rss / 2**20, 1))
    if probe_online:
        prober.join()
        ids = [json.loads(line)["custom_id"] for line in client.files.content(batch.output_file_id).text.splitlines()]
        figures["every_line_once"] = len(ids) == count and set(ids) == {f"line-{i}" for i in range(count)}
    return figures


def app_args(path: Path, device: str, replicas: int, storage_uri: str | None = None,
             engine_kwargs: dict | None = None) -> dict:
    """configs/local.yaml's application (benchmarks/online_serving.py's), on `replicas` replicas that share the
    machine's cores (and GPU) evenly; its batches in `storage_uri` (default: a fresh local directory); its engine
    options with `engine_kwargs` added."""
    args = local_config_args(path, direct_streaming=True)
    if storage_uri:
        args["storage_uri"] = storage_uri
    llm = args["llm_configs"][0]
    llm["engine_kwargs"].update(device=device, **(engine_kwargs or {}))
    llm["deployment_config"]["num_replicas"] = replicas
    actor_options = llm["deployment_config"]["ray_actor_options"]
    actor_options["num_cpus"] = os.cpu_count() // replicas
    if device == "cuda":
        actor_options["num_gpus"] = 1 / replicas  # the tiny model's engines share the one GPU
    return args


@contextmanager
def serving(path: Path, device: str, replicas: int = 1, storage_uri: str | None = None,
            engine_kwargs: dict | None = None):
    """configs/local.yaml's application on a fresh Ray; yields its OpenAI base URL."""
    with serving_app(app_args(path, device, replicas, storage_uri, engine_kwargs)) as url:
        yield f"{url}/v1"


@contextmanager
def serving_app(args: dict):
    """The app of `args` on a fresh Ray; yields its base URL. After, waits for this Ray's own processes only: the
    machine may be running other people's."""
    import ray
    from ray import serve

    from deployments import build_openai_app

    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app(args), route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        wait_until(lambda: not psutil.Process().children(recursive=True), timeout=60, every=0.5)


def served(path: Path, device: str, lines_only: bool, replicas: int = 1) -> dict:
    with serving(path, device, replicas) as url:
        client = openai.Client(base_url=url, api_key="none", max_retries=0)
        run_batch(client, WARMUP_LINES)
        seats = {}
        with engine_seats(seats):
            batch = run_batch(client, LINES)
        batch.update(seats)
        if lines_only:
            return {"batch": batch}
        idle_ttft = ttft_p50_ms(client)
        return {"batch": batch, "mid_batch": run_batch(client, MID_LINES),
                "big_batch": run_batch(client, BIG_LINES, probe_online=True), "online_ttft_p50_ms_idle": idle_ttft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines-only", action="store_true")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    lines_only = args.lines_only or args.replicas > 1
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="batch-bench-")), "qwen2")
    before = offline_lines_s(path, args.device)
    ours = served(path, args.device, lines_only)
    scaled = served(path, args.device, True, args.replicas)["batch"] if args.replicas > 1 else None
    after = offline_lines_s(path, args.device)
    engine = (before + after) / 2
    ratio = {"device": args.device, "cpus": os.cpu_count(), "lines": LINES, "max_tokens": MAX_TOKENS,
             "served": ours["batch"], "offline_engine_lines_s_before_after": [before, after],
             "served_over_offline": round(ours["batch"]["lines_s"] / engine, 3)}
    if scaled:
        ratio.update({f"served_on_{args.replicas}_replicas": scaled,
                      "replicas_over_one": round(scaled["lines_s"] / ours["batch"]["lines_s"], 3)})
    if lines_only:
        report("batch_throughput", **ratio)
        return
    big, mid = ours["big_batch"], ours["mid_batch"]
    report("batch_throughput", **ratio, mid_batch={"lines": MID_LINES, **mid}, big_batch={"lines": BIG_LINES, **big},
           manager_peak_rss_big_over_mid=round(big["manager_peak_rss_mib"] / mid["manager_peak_rss_mib"], 3),
           online_ttft_p50_ms_idle=ours["online_ttft_p50_ms_idle"],
           online_ttft_during_big_batch_over_idle=round(big["online_ttft_p50_ms_during"]
                                                        / ours["online_ttft_p50_ms_idle"], 2))


if __name__ == "__main__":
    main()
