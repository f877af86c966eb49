"""Online serving: our Ray Serve app vs `transformers serve --continuous-batching`, same model, same run.

Streaming chat completions through the `openai` SDK, 128 requests at
concurrency 32, each a shared ~250-token system prompt plus a unique question,
64 output tokens. Reports output tokens/s, TTFT p50/p99 and inter-token
latency p50 for each server, and our online throughput against our offline
engine on the same prompts, both with all 128 requests at once and at the
server's concurrency (max_num_seqs=32), which isolates what Ray Serve costs.

Our server runs twice: with Ray Serve's defaults, and with Serve's own
throughput switch RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (direct ingress, user code
on the replica's event loop; see the README). The ratios use the better run.

Run: python -m benchmarks.online_serving
"""

import asyncio
import os
import random
import statistics
import subprocess
import sys
import time

import openai
import requests

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams
from tests.helpers import free_port, wait_until

NUM_REQUESTS, CONCURRENCY, OUTPUT = 128, 32, 64
MODEL_ID = "bench-model"
WORDS = ("the river runs north past old stone towns where people trade grain salt and wool "
         "while the mountains hold snow through summer and the sea brings storms in autumn").split()


def workload(tokenizer) -> list[list[dict]]:
    rng = random.Random(0)
    system = " ".join(rng.choice(WORDS) for _ in range(400))
    while len(tokenizer.encode(system)) > 250:
        system = system.rsplit(" ", 1)[0]
    questions = [" ".join(rng.choice(WORDS) for _ in range(18)) + "?" for _ in range(NUM_REQUESTS)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]


async def drive(base_url: str, model: str, conversations, extra_body: dict) -> dict:
    client = openai.AsyncClient(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    limit = asyncio.Semaphore(CONCURRENCY)
    ttfts, gaps, tokens = [], [], 0

    async def one(messages):
        nonlocal tokens
        async with limit:
            start = time.perf_counter()
            last = None
            stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=OUTPUT,
                                                          temperature=0, stream=True, extra_body=extra_body)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    now = time.perf_counter()
                    if last is None:
                        ttfts.append(now - start)
                    else:
                        gaps.append(now - last)
                    last = now
                    tokens += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(m) for m in conversations))
    elapsed = time.perf_counter() - start
    ttfts.sort()
    return {"output_tok_s": round(tokens / elapsed, 1), "streamed_chunks": tokens,
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "ttft_p99_ms": round(1000 * ttfts[int(0.99 * (len(ttfts) - 1))], 1),
            "itl_p50_ms": round(1000 * statistics.median(gaps), 2), "seconds": round(elapsed, 2)}


def healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def ours(path, conversations, throughput_optimized: bool) -> dict:
    import ray
    from ray import serve

    from deployments import build_openai_app

    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = str(int(throughput_optimized))  # inherited by Ray's processes
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app({"llm_configs": [{
        "model_loading_config": {"model_id": MODEL_ID, "model_source": str(path)},
        "engine_kwargs": {"max_model_len": 1024}}]}), route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    asyncio.run(drive(f"{base}/v1", MODEL_ID, conversations[:4], {"ignore_eos": True}))  # warm-up
    result = asyncio.run(drive(f"{base}/v1", MODEL_ID, conversations, {"ignore_eos": True}))
    serve.shutdown()
    ray.shutdown()
    return result


def peer(path, conversations) -> dict:
    port = free_port()
    command = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(path),
               "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: healthy(f"http://127.0.0.1:{port}/health"), timeout=300, every=1)
        asyncio.run(drive(f"http://127.0.0.1:{port}/v1", str(path), conversations[:4], {}))
        return asyncio.run(drive(f"http://127.0.0.1:{port}/v1", str(path), conversations, {}))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def offline(path, conversations, **engine_kwargs) -> float:
    llm = LLM(str(path), max_model_len=1024, **engine_kwargs)
    llm.chat(conversations[:2], SamplingParams(temperature=0, max_tokens=2))
    start = time.perf_counter()
    llm.chat(conversations, SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True))
    return NUM_REQUESTS * OUTPUT / (time.perf_counter() - start)


def main() -> None:
    path = build_cpu_model()
    from transformers import AutoTokenizer

    conversations = workload(AutoTokenizer.from_pretrained(path))
    offline_tps = offline(path, conversations)
    offline_same_concurrency_tps = offline(path, conversations, max_num_seqs=CONCURRENCY)
    default_serve = ours(path, conversations, throughput_optimized=False)
    optimized_serve = ours(path, conversations, throughput_optimized=True)
    mine = max(default_serve, optimized_serve, key=lambda r: r["output_tok_s"])
    theirs = peer(path, conversations)
    report("online_serving", requests=NUM_REQUESTS, concurrency=CONCURRENCY, ours=default_serve,
           ours_serve_throughput_optimized=optimized_serve,
           transformers_serve_cb=theirs, offline_engine_tok_s=round(offline_tps, 1),
           offline_engine_at_concurrency_tok_s=round(offline_same_concurrency_tps, 1),
           throughput_ratio=round(mine["output_tok_s"] / theirs["output_tok_s"], 2),
           ttft_p50_ratio=round(mine["ttft_p50_ms"] / theirs["ttft_p50_ms"], 3),
           online_over_offline=round(mine["output_tok_s"] / offline_tps, 3),
           online_over_offline_at_concurrency=round(mine["output_tok_s"] / offline_same_concurrency_tps, 3))


if __name__ == "__main__":
    main()
