"""Tensor parallelism on CPU: TP=2 vs TP=1 throughput and latency on the CPU benchmark model,
and the per-step coordination overhead of TP (the step broadcast from rank 0) in microseconds.

On this 2-core machine TP=2 cannot add compute: the figures show what coordination costs.
Run: python -m benchmarks.tensor_parallel
"""

import statistics
import time

import ray

from benchmarks.common import build_cpu_model, report, shared_prefix_prompts
from runtime import LLM, SamplingParams
from runtime.worker import model_runner

OUTPUT = 64


def measure(path, tp: int) -> dict:
    llm = LLM(str(path), max_model_len=1024, tensor_parallel_size=tp)
    broadcasts = []
    real_broadcast = model_runner.broadcast_from_rank0

    def timed_broadcast(obj=None):
        start = time.perf_counter()
        result = real_broadcast(obj)
        broadcasts.append(time.perf_counter() - start)
        return result

    model_runner.broadcast_from_rank0 = timed_broadcast
    try:
        prompts = shared_prefix_prompts(32, 250, 30)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        broadcasts.clear()
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True))
        batch_s = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True))
        single_s = time.perf_counter() - start
        figures = {"output_tok_s_32_requests": round(32 * OUTPUT / batch_s, 1),
                   "single_request_ms_per_token": round(1000 * single_s / OUTPUT, 2)}
        if broadcasts:  # rank 0 handing each step's inputs to the workers: TP's per-step coordination
            figures["step_broadcast_us_mean"] = round(1e6 * statistics.mean(broadcasts), 1)
            figures["step_broadcast_us_p50"] = round(1e6 * statistics.median(broadcasts), 1)
        return figures
    finally:
        model_runner.broadcast_from_rank0 = real_broadcast
        llm.shutdown()


def main() -> None:
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    path = build_cpu_model()
    report("tensor_parallel_cpu", tp1=measure(path, 1), tp2=measure(path, 2))


if __name__ == "__main__":
    main()
