"""vLLM's `priority` field under load: a short chat's time to first token while a flood of long streamed chats
fills the engine, with the field (the flood at priority 1, the probe at 0) and without it (both at the default),
on configs/local.yaml's app (benchmarks/batch_throughput.py's setup) with the engine's seats cut to SEATS so that
the flood queues in the engine (below Serve's `max_ongoing_requests`, where the engine's order applies).

Reported: the probes' median time to first token idle (one after another), and beside the flood (sent together)
with the field and without it.

Run: python -m benchmarks.priority [--device cpu|cuda]
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import openai
import torch

from benchmarks.batch_throughput import serving
from benchmarks.common import report
from benchmarks.online_serving import MODEL_ID
from testing.model_factory import build_model_dir

SEATS, FLOOD, FLOOD_TOKENS, PROBES = 32, 128, 200, 5


async def first_token_s(client: openai.AsyncClient, priority: int | None, max_tokens: int) -> float:
    start = time.perf_counter()
    extra = {"ignore_eos": True} | ({} if priority is None else {"priority": priority})
    stream = await client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "what comes next?"}], max_tokens=max_tokens,
        temperature=0, stream=True, extra_body=extra)
    elapsed = None
    async for chunk in stream:
        if elapsed is None and chunk.choices and chunk.choices[0].delta.content:
            elapsed = time.perf_counter() - start
    return elapsed


async def probe_beside_flood(client: openai.AsyncClient, flood_priority: int | None,
                             probe_priority: int | None) -> float:
    """The probes' median time to first token, sent together once the flood fills the engine (its first requests
    done, the rest running or queued)."""
    flood = [asyncio.create_task(first_token_s(client, flood_priority, FLOOD_TOKENS)) for _ in range(FLOOD)]
    await asyncio.wait(flood, return_when=asyncio.FIRST_COMPLETED)
    times = await asyncio.gather(*(first_token_s(client, probe_priority, 8) for _ in range(PROBES)))
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    return statistics.median(times)


async def measure(base_url: str) -> dict:
    client = openai.AsyncClient(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    idle = statistics.median([await first_token_s(client, None, 8) for _ in range(PROBES)])
    with_field = await probe_beside_flood(client, 1, 0)
    without = await probe_beside_flood(client, None, None)
    return {"idle_ttft_ms": round(1e3 * idle, 1), "with_priority_ttft_ms": round(1e3 * with_field, 1),
            "without_priority_ttft_ms": round(1e3 * without, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="priority-")), "qwen2")
    with serving(path, args.device, engine_kwargs={"max_num_seqs": SEATS}) as base_url:
        figures = asyncio.run(measure(base_url))
    report("priority", device=args.device, cpus=os.cpu_count(), seats=SEATS, flood=FLOOD,
           flood_tokens=FLOOD_TOKENS, **figures)


if __name__ == "__main__":
    main()
