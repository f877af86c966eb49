"""The KV tier shared by engines, when nodes die, on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`,
one host): two engines in actors on nodes of their own (as two replicas), the tier's directory on a third.

1. Engine A computes a long prompt; engine B's first request with it is a hit from the tier.
2. The directory's node is SIGKILLed: Ray restarts the directory elsewhere, empty. A request on B meanwhile is
   computed there (no error, no long wait); a prompt A computes afterwards is published again, and B hits it.
3. A's node is SIGKILLed: B still hits what it holds itself (the first prompt), and a prompt only A had
   published (its objects died with A) is computed on B, without error and without waiting for Ray to declare
   A's node dead.

Run as a script (Ray allows one cluster per process): `python -m tests.reliability.shared_tier_cluster OUT.json`;
tests/reliability/test_multinode.py runs it and checks the figures it writes.
"""

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from testing.helpers import wait_until
from testing.model_factory import build_model_dir
from tests.reliability.multinode_cluster import FAST_DETECTION

PROMPT = 1000
OPTIONS = dict(max_model_len=1100, kv_offloading_size=0.01,
               kv_shared_tier={"size_gib": 0.05, "name": "cluster", "min_prompt_tokens": 256})


def main(out: str) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from runtime import LLM, SamplingParams
    from runtime.kv_tier.shared import DIRECTORY_PREFIX, KVDirectory

    @ray.remote(num_cpus=1)
    class Engine:
        def __init__(self, path: str):
            self.llm = LLM(path, **OPTIONS)

        def run(self, prompt: list[int]) -> dict:
            """The prompt's first 4 greedy tokens; its cached tokens; seconds; its blocks published."""
            start = time.monotonic()
            [output] = self.llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            seconds = time.monotonic() - start
            self.llm.engine.shared_tier.flush()
            return {"tokens": output.outputs[0].token_ids, "cached": output.num_cached_tokens,
                    "seconds": round(seconds, 2)}

    model_dir = build_model_dir(Path(tempfile.mkdtemp()) / "model", "qwen2")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_DETECTION})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(4)]  # a, b, the directory's, a spare
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)

    def on(node):
        return NodeAffinitySchedulingStrategy(node.node_id, soft=False)

    directory = KVDirectory.options(name=DIRECTORY_PREFIX + "cluster", namespace="rayllm", lifetime="detached",
                                    scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[2].node_id, soft=True)
                                    ).remote(int(0.05 * 2**30))
    ray.get(directory.stats.remote())
    a, b = (Engine.options(scheduling_strategy=on(node)).remote(str(model_dir)) for node in nodes[:2])
    rng = random.Random(0)
    first, second, third = ([rng.randrange(3, 500) for _ in range(PROMPT)] for _ in range(3))
    figures = {"a_computes": ray.get(a.run.remote(first)), "b_from_tier": ray.get(b.run.remote(first))}

    cluster.remove_node(nodes[2], allow_graceful=False)  # the directory's node
    figures["b_while_directory_restarts"] = ray.get(b.run.remote(second))

    def directory_answers() -> bool:
        try:
            return ray.get(directory.stats.remote(), timeout=5)["blocks"] >= 0
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return False  # still restarting on another node

    wait_until(directory_answers, 60)
    figures["a_publishes_again"] = ray.get(a.run.remote(third))
    figures["b_from_restarted_tier"] = ray.get(b.run.remote(third))

    only_a = [rng.randrange(3, 500) for _ in range(PROMPT)]
    figures["a_publishes_before_its_loss"] = ray.get(a.run.remote(only_a))
    cluster.remove_node(nodes[0], allow_graceful=False)  # a's node
    figures["b_own_cache_after_a_lost"] = ray.get(b.run.remote(first))
    figures["b_computes_what_only_a_had"] = ray.get(b.run.remote(only_a))
    Path(out).write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
