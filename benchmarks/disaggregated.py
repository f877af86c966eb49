"""Prefill/decode disaggregation against colocated serving, on CPU: decode streams' time per output token while
long prompts keep arriving, through the `openai` SDK, in one run.

Both layouts get the same two engines' worth of cores (one CPU each): colocated, two replicas of the model; or
disaggregated, one prefill and one decode replica sharing a KV tier. The workload: STREAMS chat streams of short
prompts and OUTPUT tokens each, while a LONG-token prompt (asking for 4 tokens) arrives every ARRIVAL_S seconds.
Reported: the streams' TPOT p50/p99 (the gaps between their chunks after the first) and the long prompts' TTFT
p50. On two cores "the same total cores" is the fair comparison: disaggregation takes one engine away from
decoding, so what it buys is the decode replica's steps never carrying a long prefill chunk.

the CPU benchmark model. Run: python -m benchmarks.disaggregated
"""

import asyncio
import logging
import random
import statistics
import tempfile
import time
import uuid

import openai
from ray import serve

from benchmarks.common import build_cpu_model, report
from deployments import build_openai_app

STREAMS, OUTPUT, LONG, ARRIVAL_S, DURATION_S = 4, 96, 1500, 2.0, 30.0
ENGINE = {"max_model_len": 2048, "max_num_batched_tokens": 512, "kv_cache_bytes": 256 << 20, "warm_up": True}


def _args(path: str, disaggregated: bool) -> dict:
    engine = dict(ENGINE)
    config = {"model_loading_config": {"model_id": "bench", "model_source": path},
              "deployment_config": {"num_replicas": 1 if disaggregated else 2,
                                    "ray_actor_options": {"num_cpus": 1}}}
    if disaggregated:
        engine.update(kv_offloading_size=0.5, kv_shared_tier={"size_gib": 1, "name": f"bench-{uuid.uuid4()}",
                                                              "min_prompt_tokens": 256})
        config["prefill_config"] = {}
    config["engine_kwargs"] = engine
    return {"llm_configs": [config], "storage_uri": f"file://{tempfile.mkdtemp()}", "start_batch_manager": False}


async def _stream_gaps(client, rng: random.Random, gaps: list[float]) -> None:
    words = " ".join(str(rng.randrange(10**6)) for _ in range(20))
    stream = await client.chat.completions.create(model="bench", messages=[{"role": "user", "content": words}],
                                                  max_tokens=OUTPUT, temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True})
    last = None
    async for chunk in stream:
        now = time.perf_counter()
        if last is not None and chunk.choices and chunk.choices[0].delta.content:
            gaps.append(now - last)
        last = now


async def _long(client, rng: random.Random, ttfts: list[float]) -> None:
    content = " ".join(str(rng.randrange(10**6)) for _ in range(LONG // 7))  # about 7 tokens a number
    start = time.perf_counter()
    stream = await client.chat.completions.create(model="bench", messages=[{"role": "user", "content": content}],
                                                  max_tokens=4, temperature=0, stream=True)
    async for chunk in stream:  # the first chunk with text (the role's comes before any token)
        if chunk.choices and chunk.choices[0].delta.content:
            ttfts.append(time.perf_counter() - start)
            break


async def _load(url: str) -> dict:
    client = openai.AsyncClient(base_url=f"{url}/v1", api_key="none", timeout=600)
    rng, gaps, ttfts, tasks = random.Random(0), [], [], []
    deadline = time.perf_counter() + DURATION_S

    async def streams():
        while time.perf_counter() < deadline:
            await asyncio.gather(*(_stream_gaps(client, rng, gaps) for _ in range(STREAMS)))

    async def arrivals():
        while time.perf_counter() < deadline:
            tasks.append(asyncio.create_task(_long(client, rng, ttfts)))
            await asyncio.sleep(ARRIVAL_S)

    await asyncio.gather(streams(), arrivals())
    await asyncio.gather(*tasks)
    gaps.sort()
    return {"tpot_p50_ms": round(1000 * statistics.median(gaps), 1),
            "tpot_p99_ms": round(1000 * gaps[int(0.99 * (len(gaps) - 1))], 1),
            "long_prompts": len(ttfts), "long_ttft_p50_s": round(statistics.median(ttfts), 2)}


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    path = str(build_cpu_model())
    serve.start(http_options={"port": 8765})
    for disaggregated in (False, True):
        serve.run(build_openai_app(_args(path, disaggregated)), name="pd", route_prefix="/pd")
        figures = asyncio.run(_load("http://127.0.0.1:8765/pd"))
        report("disaggregated", layout="prefill+decode" if disaggregated else "two colocated replicas", **figures)
        serve.delete("pd")
    serve.shutdown()


if __name__ == "__main__":
    main()
