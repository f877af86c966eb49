"""Cold start: the first requests after the app says ready against the ones after, with the replica's warm-up
(`engine_kwargs.warm_up`, on by default in a server) off and on, each on a fresh Ray.

configs/local.yaml's application on the tiny Qwen2 model the tests build (benchmarks/batch_throughput.py's
setup), started twice per setting. Once `serve.run` returns (the replica healthy): on the first start, PROBES
streaming chats one after another, each timed to its first content chunk; on the second, BATCHES batches of
batch_throughput.LINES lines, one after another, each timed from create to completed (apart: batch lines get
fewer seats for a while after online requests, which would slow the first batch after the chats). Reported:
the first chat's time to first token over the last's, and the first batch's lines/s over the mean of the
others'.

Run: python -m benchmarks.cold_start [--device cpu|cuda]
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import openai
import torch

from benchmarks.batch_throughput import LINES, run_batch, serving
from benchmarks.common import report
from benchmarks.online_serving import MODEL_ID
from testing.model_factory import build_model_dir

PROBES, BATCHES = 10, 3


def first_token_s(client: openai.Client, i: int) -> float:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": f"question {i}: what comes next?"}], max_tokens=8,
        temperature=0, stream=True, extra_body={"ignore_eos": True})
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed


def after_ready(path: Path, device: str, warm_up: bool) -> dict:
    started = time.perf_counter()
    with serving(path, device, engine_kwargs={"warm_up": warm_up}) as base_url:
        ready_s = time.perf_counter() - started
        client = openai.Client(base_url=base_url, api_key="none", max_retries=0)
        ttfts = [first_token_s(client, i) for i in range(PROBES)]
    with serving(path, device, engine_kwargs={"warm_up": warm_up}) as base_url:
        client = openai.Client(base_url=base_url, api_key="none", max_retries=0)
        batches = [run_batch(client, LINES)["lines_s"] for _ in range(BATCHES)]
    return {"ready_s": round(ready_s, 1), "ttft_ms": [round(1000 * t, 1) for t in ttfts],
            "first_over_last_ttft": round(ttfts[0] / ttfts[-1], 2), "batch_lines_s": batches,
            "first_over_next_batches": round(batches[0] / statistics.mean(batches[1:]), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="cold-start-")), "qwen2")
    report("cold_start", device=args.device, cpus=os.cpu_count(), lines=LINES,
           warm_up_off=after_ready(path, args.device, False), warm_up_on=after_ready(path, args.device, True))


if __name__ == "__main__":
    main()
