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
from runtime.engine.llm_engine import LLMEngine
from testing.model_factory import build_model_dir


def profile_decode(engine: LLMEngine, batch: int, context: int, steps: int) -> dict:
    """Step `batch` running sequences of `context` prompt tokens `steps` times (after prefill and a warm-up):
    wall and device-busy time per step; the profiler's operator table and the host's Python profile go to
    stdout."""
    cuda = engine.config.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    vocab = engine.spec.vocab_size
    params = SamplingParams(temperature=0, max_tokens=4 * steps + 64, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"p{i}", [(i * 7919 + j * 31) % (vocab - 3) + 3 for j in range(context)], params)
    while engine.scheduler.num_waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                                 for s in engine.scheduler.running):
        engine.step()
    for _ in range(5):  # warm up (graph capture and kernel compilation happen before this point)
        engine.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    wall = (time.perf_counter() - start) / steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    events = prof.key_averages()
    busy_us = sum(e.self_device_time_total for e in events) / steps
    print(events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=20))
    python = cProfile.Profile()  # the host's share: which Python functions the step spends its time in
    python.runcall(lambda: [engine.step() for _ in range(steps)])
    pstats.Stats(python).sort_stats("tottime").print_stats(25)
    for request_id in [f"p{i}" for i in range(batch)]:
        engine.abort(request_id)
    return dict(batch=batch, context=context, step_ms=round(wall * 1e3, 2), gpu_busy_ms=round(busy_us / 1e3, 2),
                decode_tok_s=round(batch / wall))


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
    figures = profile_decode(llm.engine, args.batch, args.context, args.steps)
    report("decode_profile", device=torch.cuda.get_device_name(), enforce_eager=args.enforce_eager, **figures)


if __name__ == "__main__":
    main()
