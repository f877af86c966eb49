"""The KV tier shared by replicas, on CPU: engines in Ray actors of their own (as replicas are), one computing a
4,000-token system prompt; then the first request with that prompt on a second engine, which fetches the
prompt's blocks from the shared tier, against a third engine without the tier that recomputes them (the same
run, one engine at a time on the machine's cores).

the CPU benchmark model. Run: python -m benchmarks.kv_shared_tier [--prompt 4000]
"""

import argparse
import random
import time
import uuid

import ray

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams

FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


@ray.remote
class Replica:
    def __init__(self, path: str, options: dict):
        self.llm = LLM(path, max_model_len=4096, **options)
        self.llm.generate([[5] * 64], FIRST_TOKEN)  # warm-up

    def first_token(self, prompt: list[int]) -> tuple[float, int]:
        start = time.perf_counter()
        [out] = self.llm.generate([prompt], FIRST_TOKEN)
        seconds = time.perf_counter() - start
        if self.llm.engine.shared_tier is not None:
            self.llm.engine.shared_tier.flush()
        return seconds, out.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=4000)
    args = parser.parse_args()
    ray.init()
    path = str(build_cpu_model())
    shared = {"kv_offloading_size": 0.25, "kv_shared_tier": {"size_gib": 1, "name": f"bench-{uuid.uuid4()}"}}
    rng = random.Random(0)
    system = [rng.randrange(3, 8000) for _ in range(args.prompt)]
    figures = {}
    for label, options, prompt in [("replica_a_computes", shared, system + [1]),
                                   ("replica_b_from_shared_tier", shared, system + [2]),
                                   ("replica_c_recomputes", {}, system + [2])]:
        replica = Replica.remote(path, options)
        seconds, cached = ray.get(replica.first_token.remote(prompt))
        figures[f"{label}_ttft_s"], figures[f"{label}_cached_tokens"] = round(seconds, 3), cached
        if label != "replica_a_computes":  # a keeps its published blocks alive
            ray.kill(replica)
        else:
            publisher = replica
    report("kv_shared_tier", prompt_tokens=args.prompt, **figures)
    ray.kill(publisher)


if __name__ == "__main__":
    main()
