"""Where a decode step's time goes on the GPU: a full batch of running sequences of the Qwen2.5-0.5B
shape (bf16, random weights), stepped with torch's profiler on. Prints wall time per step, GPU busy
time per step, the top operators by GPU time, and the Python functions that take the host's time.

Run on a CUDA machine: python -m benchmarks.decode_profile [--batch 256] [--context 512] [--enforce-eager]
"""

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import report
from benchmarks.gpu_throughput import QWEN25_05B
from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="qwen05b-")), **QWEN25_05B)
    llm = LLM(str(path), dtype="bfloat16", max_model_len=4096, max_num_seqs=args.batch,
              max_num_batched_tokens=16384, enforce_eager=args.enforce_eager)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4 * args.steps + 64, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"p{i}", [(i * 7919 + j * 31) % 150000 + 3 for j in range(args.context)], params)
    while engine.scheduler.num_waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                                 for s in engine.scheduler.running):
        engine.step()
    for _ in range(5):  # warm up (graph capture and kernel compilation happen before this point)
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / args.steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) / args.steps
    print(events.table(sort_by="self_cuda_time_total", row_limit=20))
    python = cProfile.Profile()  # the host's share: which Python functions the step spends its time in
    python.runcall(lambda: [engine.step() for _ in range(args.steps)])
    pstats.Stats(python).sort_stats("tottime").print_stats(25)
    report("decode_profile", device=torch.cuda.get_device_name(), batch=args.batch, context=args.context,
           enforce_eager=args.enforce_eager, step_ms=round(wall * 1e3, 2), gpu_busy_ms=round(gpu_us / 1e3, 2),
           decode_tok_s=round(args.batch / wall))


if __name__ == "__main__":
    main()
