"""The KV offload tier on CPU: a long prompt's time to first token when its prefix, evicted from the pool by
other prompts, comes back from the tier, against recomputing it (the same engine settings without the tier, in
the same run); then a churn of distinct prompts, reporting the tier's largest size against its bound.

the CPU benchmark model; a pool of 4,096 tokens, so that a handful of other prompts evict the prefix.

Run: python -m benchmarks.kv_offload [--prefix 2000] [--churn-seconds 60]
"""

import argparse
import random
import time

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams

FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
POOL_TOKENS = 4096


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, 8000) for _ in range(length)]


def _ttft(llm: LLM, prompt: list[int]) -> tuple[float, int]:
    start = time.perf_counter()
    [out] = llm.generate([prompt], FIRST_TOKEN)
    return time.perf_counter() - start, out.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--tier-gib", type=float, default=0.5)
    parser.add_argument("--churn-seconds", type=float, default=60)
    args = parser.parse_args()
    path = build_cpu_model()
    probe = LLM(str(path), max_model_len=args.prefix + 64, kv_cache_bytes=1 << 30)
    pool_bytes = POOL_TOKENS * probe.engine.runner.kv_bytes_per_token
    probe.shutdown()
    rng = random.Random(0)
    prefix = _prompt(rng, args.prefix)
    evictors = [_prompt(rng, args.prefix) for _ in range(3)]
    for tier in (None, args.tier_gib):
        llm = LLM(str(path), max_model_len=args.prefix + 64, kv_cache_bytes=pool_bytes, kv_offloading_size=tier)
        _ttft(llm, _prompt(rng, 64))  # warm-up
        cold, _ = _ttft(llm, prefix + [1])
        for other in evictors:
            llm.generate([other], FIRST_TOKEN)
        again, cached = _ttft(llm, prefix + [2])
        report("kv_offload", tier_gib=tier or 0, prefix_tokens=args.prefix, ttft_cold_s=round(cold, 3),
               ttft_after_eviction_s=round(again, 3), cached_tokens=cached)
        if tier is None:
            llm.shutdown()
    largest, deadline, requests = 0, time.monotonic() + args.churn_seconds, 0
    while time.monotonic() < deadline:
        llm.generate([_prompt(rng, rng.randrange(64, args.prefix)) for _ in range(4)], FIRST_TOKEN)
        requests += 4
        largest = max(largest, llm.engine.stats()["kv_offload_bytes"])
    stats = llm.engine.stats()
    report("kv_offload_churn", seconds=args.churn_seconds, requests=requests, largest_tier_bytes=largest,
           capacity_bytes=stats["kv_offload_capacity_bytes"], stored_blocks=stats["kv_offload_stored_blocks"])


if __name__ == "__main__":
    main()
