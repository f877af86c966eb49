"""Host work per decode step, the CPU proxy for the GPU's host-bound decode: a micro model whose compute is
negligible, 256 running sequences, and the step's time split into its phases (schedule, prepare the inputs,
the forward pass, sample, collect the tokens, post-process: tokens appended, ends by id and length, deltas
built), with async scheduling off and on, in one run. `text_ms` is the text stage's work per step
(detokenized, stop strings checked: runtime.engine.text_stage), which a server does on a thread of its own, off
the engine's (AsyncLLMEngine); `host_ms` is the engine thread's own.

On a CPU nothing runs beside the host, so both modes do the same host work; what async scheduling changes is
which of it a GPU waits for. Without it, every host phase runs while the device idles (the step's tokens are
read before the next step is scheduled). With it, the next step is launched before the tokens are read, so
the device waits only for the host work that exceeds its own step: `device_waits_ms` is host_ms without
async scheduling and max(0, host_ms - device_ms) with it, device_ms being what the step's forward pass and
sampling take on the device (on this CPU, their time on the host, which also includes launching them).

A server freezes its startup heap out of the garbage collector's passes (runtime.engine.startup_heap); the last
run does so too, as a server's engine runs (`heap: frozen`), async scheduling off.

Run: python -m benchmarks.host_overhead [--batch 256] [--steps 50]
"""

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import report
from runtime import LLM, SamplingParams
from runtime.engine.startup_heap import freeze_startup_heap
from testing.model_factory import build_model_dir

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


def measure(path: Path, batch: int, steps: int, async_scheduling: bool) -> dict:
    """Per-step milliseconds of each phase, `batch` sequences decoding."""
    llm = LLM(str(path), max_model_len=1024, max_num_seqs=batch, max_num_batched_tokens=8192,
              kv_cache_bytes=256 << 20, async_scheduling=async_scheduling)
    engine = llm.engine
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10 * steps + 64, ignore_eos=True,
                            stop=["never appears"], seed=1)
    for i in range(batch):
        engine.add_request(f"p{i}", [(i * 31 + j) % 500 + 3 for j in range(16)], params)
    for _ in range(10):  # prefill, then a few decode steps to warm up
        engine.step()
    assert len(engine.scheduler.running) == batch
    phases: dict[str, float] = defaultdict(float)
    runner = engine.runner
    engine.scheduler.schedule = timed(phases, "schedule", engine.scheduler.schedule)
    runner.prepare = timed(phases, "prepare", runner.prepare)
    runner.execute = timed(phases, "forward", runner.execute)
    runner._sample = timed(phases, "sample", runner._sample)
    runner.collect = timed(phases, "collect", runner.collect)
    engine.text.apply = timed(phases, "text", engine.text.apply)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_ms = (time.perf_counter() - start) * 1e3 / steps
    per_step = {name: total * 1e3 / steps for name, total in phases.items()}
    per_step["post_process"] = step_ms - sum(per_step.values())
    device_ms = per_step["forward"] + per_step["sample"]
    host_ms = step_ms - device_ms - per_step["text"]
    return {"async_scheduling": async_scheduling, "step_ms": round(step_ms, 3), "host_ms": round(host_ms, 3),
            "device_ms": round(device_ms, 3),
            "device_waits_ms": round(max(0.0, host_ms - device_ms) if async_scheduling else host_ms, 3),
            **{f"{name}_ms": round(ms, 3) for name, ms in per_step.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="micro-")), **MICRO)
    for async_scheduling in (False, True):
        report("host_overhead", batch=args.batch, steps=args.steps, heap="collected",
               **measure(path, args.batch, args.steps, async_scheduling))
    freeze_startup_heap()
    report("host_overhead", batch=args.batch, steps=args.steps, heap="frozen",
           **measure(path, args.batch, args.steps, False))


if __name__ == "__main__":
    main()
