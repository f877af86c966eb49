"""Online serving: our Ray Serve app vs `transformers serve --continuous-batching`, same model, same run.

Streaming chat completions through the `openai` SDK, 128 requests at
concurrency 32, each a shared ~250-token system prompt plus a unique question,
64 output tokens. Reports output tokens/s, TTFT p50/p99 and time per output
token after the first (TPOT) p50 for each server, and our online throughput
against our offline engine on the same prompts, both with all 128 requests at
once and at the server's concurrency (max_num_seqs=32), which isolates what Ray
Serve costs. The offline figures are measured before and after the servers
and the ratios use their mean, since a small machine's speed drifts within
one run.

Every figure is the median of PASSES passes, each with fresh questions after
one warm-up (so the shared system prompt is cached, as in a live server): on
a small machine one pass varies widely.

Our server runs configs/local.yaml's application (its stream batching
interval included) in four modes: the ingress hop and direct streaming (the
model's replica answers HTTP itself, what `serve run configs/local.yaml` runs),
each behind Serve's Python HTTP proxy and in Ray Serve's high-throughput mode
(RAY_SERVE_THROUGHPUT_OPTIMIZED=1 with RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy in
front, gRPC between replicas; what the KubeRay manifests set). The ratios use
the best mode.
The replica reserves every core of the machine (`ray_actor_options.num_cpus`),
which sets its engine's thread count, as the offline engine uses them all.

At concurrency 1 it also measures the time to first token that Serve adds:
the p50 over TTFT_REQUESTS sequential streams of one prompt through the
`serve run configs/local.yaml` path, against the same prompt on an in-process
AsyncLLMEngine.

Run: python -m benchmarks.online_serving
"""

import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import psutil
import requests
import uvloop
import yaml

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams
from testing.helpers import free_port, wait_until

NUM_REQUESTS, CONCURRENCY, OUTPUT, PASSES, TTFT_REQUESTS = 128, 32, 64, 3, 30
# Ray's processes read these at start: (Serve's default, its high-throughput mode)
SERVE_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": ("0", "1"), "RAY_SERVE_ENABLE_HA_PROXY": ("0", "1")}
# (high-throughput mode, direct streaming) of each mode measured
MODES = {"ingress_python_proxy": (False, False), "direct_python_proxy": (False, True),
         "ingress_haproxy": (True, False), "direct_haproxy": (True, True)}
DEFAULT_MODE = "direct_python_proxy"  # configs/local.yaml with nothing exported
MODEL_ID = "bench-model"
WORDS = ("the river runs north past old stone towns where people trade grain salt and wool "
         "while the mountains hold snow through summer and the sea brings storms in autumn").split()


def workload(tokenizer, seed: int) -> list[list[dict]]:
    """The shared system prompt (always the same) with NUM_REQUESTS questions drawn from `seed`."""
    words = random.Random(0)
    system = " ".join(words.choice(WORDS) for _ in range(400))
    while len(tokenizer.encode(system)) > 250:
        system = system.rsplit(" ", 1)[0]
    rng = random.Random(seed)
    questions = [" ".join(rng.choice(WORDS) for _ in range(18)) + "?" for _ in range(NUM_REQUESTS)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]


def median_pass(run_pass, tokenizer) -> dict:
    """Warm up on a few requests, then the median of PASSES passes on fresh questions (seeds 1..PASSES)."""
    run_pass(workload(tokenizer, 0)[:4])
    results = sorted((run_pass(workload(tokenizer, seed)) for seed in range(1, PASSES + 1)),
                     key=lambda r: r["output_tok_s"])
    return {**results[PASSES // 2], "passes_tok_s": [r["output_tok_s"] for r in results]}


async def drive(base_url: str, model: str, conversations, extra_body: dict, concurrency: int = CONCURRENCY,
                output: int = OUTPUT) -> dict:
    """Stream every conversation, `concurrency` at a time. Tokens are counted from each stream's usage chunk
    where the server sends one (a chunk may carry several tokens), else as one per content chunk."""
    limit = asyncio.Semaphore(concurrency)
    ttfts, per_token, gaps, tokens, chunks = [], [], [], 0, 0

    async def one(client, messages):
        nonlocal tokens, chunks
        async with limit:
            start = time.perf_counter()
            first = last = None
            content_chunks, usage = 0, None
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=output, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body=extra_body)
            async for chunk in stream:
                usage = chunk.usage or usage
                # a stream's first text may be its last chunk (bytes that never formed a character wait for it)
                if chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
                    now = time.perf_counter()
                    if last is not None and chunk.choices[0].delta.content:
                        gaps.append(now - last)  # inter-token latency as bench_serving counts it: per chunk
                    last = now
                    first = first or last
                    content_chunks += bool(chunk.choices[0].delta.content)
            generated = usage.completion_tokens if usage else content_chunks
            ttfts.append(first - start)
            if generated > 1:  # a peer without ignore_eos may stop after one token
                per_token.append((last - first) / (generated - 1))
            tokens += generated
            chunks += content_chunks

    http = openai.DefaultAioHttpClient(timeout=600)  # the SDK's aiohttp transport: less client CPU than httpx
    async with openai.AsyncClient(base_url=base_url, api_key="none", max_retries=0, http_client=http) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client, m) for m in conversations))
        elapsed = time.perf_counter() - start
    ttfts.sort()
    return {"output_tok_s": round(tokens / elapsed, 1), "output_tokens": tokens, "content_chunks": chunks,
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "ttft_p99_ms": round(1000 * ttfts[int(0.99 * (len(ttfts) - 1))], 1),
            "tpot_p50_ms": round(1000 * statistics.median(per_token), 2),
            "itl_p50_ms": round(1000 * statistics.median(gaps), 2) if gaps else None,
            "itl_p99_ms": round(1000 * sorted(gaps)[int(0.99 * (len(gaps) - 1))], 2) if gaps else None,
            "seconds": round(elapsed, 2)}


def healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


async def first_token_s(base_url: str, model: str, messages) -> float:
    """Seconds to the first content chunk of one streamed chat."""
    async with openai.AsyncClient(base_url=base_url, api_key="none", max_retries=0) as client:
        start = time.perf_counter()
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0,
                                                      stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                return time.perf_counter() - start
    raise AssertionError("no content")


def served_ttft_ms(url: str, tokenizer) -> float:
    messages = workload(tokenizer, 99)[0]
    times = [uvloop.run(first_token_s(url, MODEL_ID, messages)) for _ in range(TTFT_REQUESTS + 2)][2:]
    return round(1000 * statistics.median(times), 1)


def in_process_ttft_ms(path, tokenizer) -> float:
    """The same prompt's p50 TTFT on an in-process AsyncLLMEngine, rendered and tokenized as the server does."""
    from runtime import AsyncLLMEngine
    from runtime.text.tokenizer import encode, render_chat

    engine = AsyncLLMEngine.from_options(str(path), 0.1, max_model_len=1024)
    params = SamplingParams(temperature=0, max_tokens=4)

    messages = workload(tokenizer, 99)[0]

    async def one() -> float:
        start = time.perf_counter()  # the template is rendered inside, as a server must
        text = render_chat(engine.tokenizer, messages, None, None, add_generation_prompt=True)
        valid = engine.validate(encode(engine.tokenizer, text, add_special_tokens=False), params)
        async for delta in engine.generate(valid):
            if any(s.text for s in delta.seqs):
                return time.perf_counter() - start
        raise AssertionError("no text")

    times = [uvloop.run(one()) for _ in range(TTFT_REQUESTS + 2)][2:]
    engine.shutdown()
    return round(1000 * statistics.median(times), 1)


def local_config_args(path, direct_streaming: bool, stream_interval_ms: float | None = None) -> dict:
    """configs/local.yaml's application, on the benchmark model, its replica on every core (its streams paced
    every `stream_interval_ms` where given, else as the config says)."""
    args = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/local.yaml").read_text())
    args = args["applications"][0]["args"]
    llm = args["llm_configs"][0]
    llm["model_loading_config"] = {"model_id": MODEL_ID, "model_source": str(path)}
    llm["engine_kwargs"] = {**llm.get("engine_kwargs", {}), "max_model_len": 1024}
    llm["deployment_config"]["ray_actor_options"]["num_cpus"] = os.cpu_count()
    if stream_interval_ms is not None:
        llm["experimental_configs"]["stream_batching_interval_ms"] = stream_interval_ms
    return {**args, "storage_uri": f"file://{tempfile.mkdtemp(prefix='bench-storage-')}",
            "direct_streaming": direct_streaming}


@contextmanager
def serving(path, high_throughput: bool, direct_streaming: bool, stream_interval_ms: float | None = None,
            args: dict | None = None):
    """Our app on a fresh Ray, in one mode (`args`: the app's, else `local_config_args`'); yields its OpenAI base
    URL."""
    import ray
    from ray import serve

    from deployments import build_openai_app

    os.environ.update({name: values[high_throughput] for name, values in SERVE_ENV.items()})
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app(args or local_config_args(path, direct_streaming, stream_interval_ms)), route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.shutdown()
        ray.shutdown()
        # Ray's workers exit after shutdown returns; the next measurement must not share the cores with them
        wait_until(lambda: not any(p.name().startswith("ray::") for p in psutil.process_iter()), timeout=60,
                   every=0.5)


def ours(path, tokenizer, high_throughput: bool, direct_streaming: bool = False, ttft: bool = False,
         stream_interval_ms: float | None = None) -> dict:
    with serving(path, high_throughput, direct_streaming, stream_interval_ms) as url:
        result = median_pass(lambda c: uvloop.run(drive(url, MODEL_ID, c, {"ignore_eos": True})), tokenizer)
        if ttft:
            result["ttft_concurrency_1_p50_ms"] = served_ttft_ms(url, tokenizer)
    return result


def peer(path, tokenizer) -> dict:
    port = free_port()
    command = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(path),
               "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: healthy(f"http://127.0.0.1:{port}/health"), timeout=300, every=1)
        url = f"http://127.0.0.1:{port}/v1"
        return median_pass(lambda c: uvloop.run(drive(url, str(path), c, {})), tokenizer)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def offline(path, tokenizer, **engine_kwargs) -> dict:
    llm = LLM(str(path), max_model_len=1024, **engine_kwargs)
    params = SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)

    def run_pass(conversations):
        start = time.perf_counter()
        llm.chat(conversations, params)
        return {"output_tok_s": round(len(conversations) * OUTPUT / (time.perf_counter() - start), 1)}

    return median_pass(run_pass, tokenizer)


def main() -> None:
    path = build_cpu_model()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    offline_before = offline(path, tokenizer)["output_tok_s"]
    offline_same_concurrency_before = offline(path, tokenizer, max_num_seqs=CONCURRENCY)["output_tok_s"]
    ttft_in_process = in_process_ttft_ms(path, tokenizer)  # before the servers: Ray leaves nothing running yet
    served = {mode: ours(path, tokenizer, high_throughput, direct, ttft=mode == DEFAULT_MODE)
              for mode, (high_throughput, direct) in MODES.items()}
    # again after the servers, since the machine's speed drifts within a run: the ratios use the mean
    offline_same_concurrency_after = offline(path, tokenizer, max_num_seqs=CONCURRENCY)["output_tok_s"]
    offline_after = offline(path, tokenizer)["output_tok_s"]
    offline_tps = (offline_before + offline_after) / 2
    offline_same_concurrency_tps = (offline_same_concurrency_before + offline_same_concurrency_after) / 2
    best = max(served, key=lambda mode: served[mode]["output_tok_s"])
    mine = served[best]
    theirs = peer(path, tokenizer)
    report("online_serving", requests=NUM_REQUESTS, concurrency=CONCURRENCY, **served,
           transformers_serve_cb=theirs, offline_engine_tok_s_before_after=[offline_before, offline_after],
           offline_engine_at_concurrency_tok_s_before_after=[offline_same_concurrency_before,
                                                             offline_same_concurrency_after],
           best_mode=best, throughput_ratio=round(mine["output_tok_s"] / theirs["output_tok_s"], 2),
           ttft_p50_ratio=round(mine["ttft_p50_ms"] / theirs["ttft_p50_ms"], 3),
           online_over_offline_at_concurrency={
               mode: round(r["output_tok_s"] / offline_same_concurrency_tps, 3) for mode, r in served.items()},
           online_over_offline_all_at_once=round(mine["output_tok_s"] / offline_tps, 3),
           ttft_concurrency_1_p50_ms={"served_default": served[DEFAULT_MODE]["ttft_concurrency_1_p50_ms"],
                                      "in_process_async_engine": ttft_in_process})


if __name__ == "__main__":
    main()
