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

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from testing.helpers import free_port, wait_until
from testing.model_factory import build_model_dir
from tests.conftest import MODEL_ID, app_args
from tests.reliability.multinode_cluster import (
    FAST_DETECTION,
    STREAMS,
    Prober,
    kill_node,
    node_of,
    stream_outcome,
    summary,
)


def stage_groups() -> list[dict]:
    """The model replicas' placement groups (two bundles, STRICT_SPREAD) that are placed."""
    import ray

    return [g for g in ray.util.placement_group_table().values()
            if g["strategy"] == "STRICT_SPREAD" and g["state"] == "CREATED"]


def stage_loss(cluster, base_url: str) -> dict:
    outcomes = [None] * STREAMS
    started = threading.Event()
    threads = [threading.Thread(target=stream_outcome, args=(base_url, started, outcomes, i), daemon=True)
               for i in range(STREAMS)]
    prober = Prober(base_url)
    prober.start()
    for t in threads:
        t.start()
    started.wait(60)
    time.sleep(1.0)  # every stream is admitted and streaming (ignore_eos, 1500 tokens: tens of seconds)
    ingress_nodes = set(node_of("OpenAIIngress"))
    victim = min(node_of("RankWorker"), key=lambda node: node in ingress_nodes)  # a stage-only node if any
    killed_at = kill_node(cluster, victim)
    for t in threads:
        t.join(150)
    rebuilt_s = None
    try:
        wait_until(lambda: len(stage_groups()) == 2, 120)
        rebuilt_s = round(time.monotonic() - killed_at, 1)
    finally:
        new_requests = summary(prober.stop(), killed_at)
    counts = {}
    for outcome in outcomes:
        kind = outcome[0] if outcome else "unfinished"
        counts[kind] = counts.get(kind, 0) + 1
    return {"streams": counts, "examples": sorted({str(o[2]) for o in outcomes if o})[:4],
            "victim_ran_ingress": victim in ingress_nodes, "new_requests": new_requests,
            "replica_rebuilt_after_s": rebuilt_s}


def main(out: str) -> None:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from deployments import build_openai_app

    tmp = Path(tempfile.mkdtemp())
    model_dir = build_model_dir(tmp / "model", "qwen2")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_DETECTION})
    for _ in range(6):  # four stages, and room to rebuild a replica after a node is lost
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    args = app_args(model_dir, f"file://{tmp / 'storage'}")
    args["shared_storage"] = True  # every "node" is this host
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
    Path(out).write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
