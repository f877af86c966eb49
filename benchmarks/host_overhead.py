"""Host work per decode step, the CPU proxy for the GPU's host-bound decode: a micro model whose compute is
negligible, 256 running sequences, and the step's time split into its phases (schedule, prepare the inputs,
the forward pass, sample, post-process: tokens appended, detokenized, stops checked, deltas built).

Run: python -m benchmarks.host_overhead [--batch 256] [--steps 50]
The step does not overlap host work with the device's yet (issue 31); this measures the host's share.
"""

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import report
from runtime import LLM, SamplingParams
from tests.model_factory import build_model_dir

MICRO = dict(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=512)


def timed(phases: dict, name: str, fn):
    """`fn`, adding its wall time to `phases[name]`."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - start
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="micro-")), **MICRO)
    llm = LLM(str(path), max_model_len=1024, max_num_seqs=args.batch, max_num_batched_tokens=8192,
              kv_cache_bytes=256 << 20)
    engine = llm.engine
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10 * args.steps + 64, ignore_eos=True,
                            stop=["never appears"], seed=1)
    for i in range(args.batch):
        engine.add_request(f"p{i}", [(i * 31 + j) % 500 + 3 for j in range(16)], params)
    for _ in range(10):  # prefill, then a few decode steps to warm up
        engine.step()
    assert len(engine.scheduler.running) == args.batch
    phases: dict[str, float] = defaultdict(float)
    runner = engine.runner
    engine.scheduler.schedule = timed(phases, "schedule", engine.scheduler.schedule)
    runner.prepare = timed(phases, "prepare", runner.prepare)
    runner.execute = timed(phases, "forward", runner.execute)
    runner._sample = timed(phases, "sample", runner._sample)
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = (time.perf_counter() - start) * 1e3 / args.steps
    per_step = {name: round(total * 1e3 / args.steps, 3) for name, total in phases.items()}
    per_step["post_process"] = round(step_ms - sum(per_step.values()), 3)
    report("host_overhead", batch=args.batch, steps=args.steps, overlap=False, step_ms=round(step_ms, 3),
           **{f"{name}_ms": ms for name, ms in per_step.items()})


if __name__ == "__main__":
    main()
