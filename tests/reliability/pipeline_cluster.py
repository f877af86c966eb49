"""A replica bigger than one node, on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`, one host): two
replicas of two pipeline stages each, every stage on a node of its own (`placement_group_config` STRICT_SPREAD),
served through the `openai` SDK; then the node of one replica's second stage is SIGKILLed while 20 streams run
and a prober sends new requests.

What it records: where the stages sat, the streams' outcomes (completed, error_event, cut, plain), the new
requests' failures and latencies from the kill on, and how long Serve took to rebuild the lost replica on the
nodes left.

Run as a script (Ray allows one cluster per process): `python -m tests.reliability.pipeline_cluster OUT.json`;
tests/reliability/test_multinode.py runs it and checks the figures it writes.
"""

import sys
import time

import openai

from testing.helpers import wait_until
from tests.conftest import MODEL_ID
from tests.reliability.multinode_cluster import kill_under_load, start_cluster, summary, write_and_stop


def stage_groups() -> list[dict]:
    """The model replicas' placement groups (two bundles, STRICT_SPREAD) that are placed."""
    import ray

    return [g for g in ray.util.placement_group_table().values()
            if g["strategy"] == "STRICT_SPREAD" and g["state"] == "CREATED"]


def stage_loss(cluster, base_url: str) -> dict:
    figures, prober, killed_at = kill_under_load(cluster, base_url, "RankWorker")  # a second stage's node
    rebuilt_s = None
    try:
        wait_until(lambda: len(stage_groups()) == 2, 120)
        rebuilt_s = round(time.monotonic() - killed_at, 1)
    finally:
        new_requests = summary(prober.stop(), killed_at)
    return {**figures, "new_requests": new_requests, "replica_rebuilt_after_s": rebuilt_s}


def main(out: str) -> None:
    from ray import serve

    from deployments import build_openai_app

    cluster, port, args, _ = start_cluster(6)  # four stages, and room to rebuild a replica after a node is lost
    args["start_batch_manager"] = False
    llm = args["llm_configs"][0]
    llm["engine_kwargs"] = {"max_model_len": 2048, "kv_cache_bytes": 256 << 20, "pipeline_parallel_size": 2}
    llm["placement_group_config"] = {"bundles": [{"CPU": 1}, {"CPU": 1}], "strategy": "STRICT_SPREAD"}
    llm["deployment_config"] = {"num_replicas": 2, "health_check_period_s": 1,
                                "ray_actor_options": {"num_cpus": 1}}
    started = time.monotonic()
    serve.run(build_openai_app(args), name="default", route_prefix="/")
    base_url = f"http://127.0.0.1:{port}"
    figures = {"startup_s": round(time.monotonic() - started, 1),
               "stage_nodes_per_replica": sorted(len(set(g["bundles_to_node_id"].values())) for g in stage_groups())}
    reply = openai.Client(base_url=f"{base_url}/v1", api_key="x").chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_body={"ignore_eos": True})
    figures["sdk_chat_tokens"] = reply.usage.completion_tokens
    figures["stage_node_killed"] = stage_loss(cluster, base_url)
    write_and_stop(out, figures, cluster)


if __name__ == "__main__":
    main(sys.argv[1])
