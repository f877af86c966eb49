"""Node losses on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`: one raylet per node, one host).

The cluster: a head with no CPUs (Serve's controller and its one proxy) and 1-CPU worker nodes whose custom
resources lay the roles out: node 1 runs a model replica and an ingress replica (and the batch manager, if Ray
places it there), node 2 the other ingress replica, node 3 the other model replica; the app's defaults must put
the ingress replicas on different nodes. A fourth node, added once the app runs, can host either role, for the
replacements. Scenarios, in order:

1. A node with a model replica is SIGKILLed while 20 streams run, the one of them that also runs the most of
   the other roles (an ingress replica, the batch manager): each stream must complete or end with an error event
   and `[DONE]`, never be cut or get a plain-text body, even through an ingress replica on that node (Serve's
   proxy on the head answers for it: deployments/http/proxy/lost_replicas.py); a prober sending new requests
   throughout must see every one succeed, within Ray's verdict on the node and a retry.
2. A worker node with an ingress replica is SIGKILLed: the prober's requests may fail only inside a short
   window.
3. The batch manager's process is SIGKILLed mid-batch and nobody calls the API: the batch must complete on its
   own (read from the storage directly), with every custom_id exactly once.

Run as a script (Ray allows one cluster per process): `python -m tests.reliability.multinode_cluster OUT.json`;
tests/reliability/test_multinode.py runs it and checks the figures it writes.
"""

import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from testing.helpers import free_port, wait_until
from testing.model_factory import build_model_dir
from tests.conftest import MODEL_ID, PROXY_ENV, app_args

STREAMS = 20
BATCH_LINES = 300
# Fast failure detection, so the test spends its time on what we do, not on Ray's default timeouts
# (a node is declared dead after 2 missed 1 s health checks here; 5 missed 3 s checks by default)
FAST_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                  "health_check_failure_threshold": 2}


class Prober(threading.Thread):
    """Sends one small chat request after another; records (start time, seconds, ok, detail)."""

    def __init__(self, base_url: str):
        super().__init__(daemon=True)
        self.base_url = base_url
        self.results: list[tuple[float, float, bool, str]] = []
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            start = time.monotonic()
            try:
                r = requests.post(f"{self.base_url}/v1/chat/completions", timeout=30, json={
                    "model": MODEL_ID, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 2})
                ok, detail = r.status_code == 200, f"{r.status_code} {r.text[:120]}"
            except requests.RequestException as e:
                ok, detail = False, repr(e)[:120]
            self.results.append((start, time.monotonic() - start, ok, detail))

    def stop(self) -> list[tuple[float, float, bool, str]]:
        self.stopped.set()
        self.join()
        return self.results


def stream_outcome(base_url: str, started: threading.Event, outcomes: list, index: int) -> None:
    """One long stream; its outcome: completed, error_event (then [DONE]), cut, or plain (not SSE)."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": f"story {index}"}], "max_tokens": 1500,
            "ignore_eos": True, "temperature": 0, "stream": True}
    events = []
    try:
        with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=120) as r:
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                outcomes[index] = ("plain", r.status_code, r.text[:120])
                return
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    events.append(line[6:])
                    started.set()
    except requests.RequestException as e:
        outcomes[index] = ("cut", len(events), repr(e)[:120])
        return
    if not events or events[-1] != b"[DONE]":
        outcomes[index] = ("cut", len(events), "no [DONE]")
    elif b'"error"' in events[-2]:
        outcomes[index] = ("error_event", len(events), json.loads(events[-2])["error"]["message"][:120])
    else:
        outcomes[index] = ("completed", len(events), json.loads(events[-2])["choices"][0]["finish_reason"])


def node_of(actor_class: str) -> list[str]:
    from ray.util.state import list_actors

    return [a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
            if actor_class in a.class_name]


def kill_node(cluster, node_id: str) -> float:
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    killed_at = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    return killed_at


def summary(results: list[tuple[float, float, bool, str]], since: float) -> dict:
    """The probes from a second before the kill on. A probe in flight at the kill ran on the node (its failure is
    `failed_in_flight`); the failure window is how long after the kill a probe sent after it could still fail."""
    after = [r for r in results if r[0] >= since - 1]
    latencies = sorted(r[1] for r in after)
    failures = [r for r in after if not r[2]]
    new_failures = [r for r in failures if r[0] >= since]
    return {
        "requests": len(after), "failed": len(failures), "failed_in_flight": len(failures) - len(new_failures),
        "failure_window_s": round(max(r[0] + r[1] for r in new_failures) - since, 2) if new_failures else 0.0,
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3) if latencies else None,
        "max_s": round(latencies[-1], 3) if latencies else None,
        "failures": [r[3] for r in failures[:5]],
    }


def kill_under_load(cluster, base_url: str, actor_class: str) -> tuple[dict, Prober, float]:
    """20 long streams and a prober running, then the node of an `actor_class` actor SIGKILLed (the one that also
    runs the most of an ingress replica and the batch manager). Returns the streams' outcomes, the roles the node
    ran, the prober (still probing) and the kill's time."""
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
    ingress_nodes, manager_nodes = set(node_of("OpenAIIngress")), set(node_of("BatchManager"))
    victim = max(node_of(actor_class), key=lambda node: (node in ingress_nodes, node in manager_nodes))
    killed_at = kill_node(cluster, victim)
    for t in threads:
        t.join(150)
    counts = {}
    for outcome in outcomes:
        counts[outcome[0] if outcome else "unfinished"] = counts.get(outcome[0] if outcome else "unfinished", 0) + 1
    return ({"streams": counts, "examples": sorted({str(o[2]) for o in outcomes if o})[:4],
             "victim_ran_ingress": victim in ingress_nodes, "victim_ran_batch_manager": victim in manager_nodes},
            prober, killed_at)


def replica_loss(cluster, base_url: str) -> dict:
    figures, prober, killed_at = kill_under_load(cluster, base_url, "LLMServer")
    time.sleep(3)
    return {**figures, "new_requests": summary(prober.stop(), killed_at)}


def ingress_loss(cluster, base_url: str) -> dict:
    wait_until(lambda: len(set(node_of("OpenAIIngress"))) == 2, 90)  # the one the last loss took is back
    prober = Prober(base_url)
    prober.start()
    time.sleep(2)
    ingress_nodes = node_of("OpenAIIngress")
    workers = {node.node_id for node in cluster.worker_nodes}
    killed_at = kill_node(cluster, next(node for node in ingress_nodes if node in workers))
    time.sleep(15)
    return {"ingress_nodes_before": len(ingress_nodes), "distinct_ingress_nodes_before": len(set(ingress_nodes)),
            "new_requests": summary(prober.stop(), killed_at)}


def manager_loss(base_url: str, storage: Path) -> dict:
    import openai
    import ray
    from ray.util.state import list_actors

    client = openai.Client(base_url=f"{base_url}/v1", api_key="x")
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL_ID, "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 4}}
             for i in range(BATCH_LINES)]
    uploaded = client.files.create(file=("b.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    state_path = storage / "batches" / batch.id / "state.json"

    def progress() -> dict:
        return json.loads(state_path.read_text())

    wait_until(lambda: state_path.exists() and progress()["batch"]["request_counts"]["completed"] > 0, 120)
    (manager,) = [a for a in list_actors(filters=[("state", "=", "ALIVE")]) if a.class_name == "BatchManager"]
    done_at_kill = progress()["batch"]["request_counts"]["completed"]
    os.kill(manager.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: progress()["batch"]["status"] == "completed", 300)  # read from storage: no API call
    finished_s = time.monotonic() - killed_at
    output = client.files.content(progress()["batch"]["output_file_id"]).text.splitlines()
    ids = [json.loads(line)["custom_id"] for line in output]
    del ray
    return {"completed_at_kill": done_at_kill, "finished_after_kill_s": round(finished_s, 1),
            "output_lines": len(ids), "unique_custom_ids": len(set(ids)),
            "all_present": sorted(set(ids)) == sorted(f"line-{i}" for i in range(BATCH_LINES))}


def start_cluster(nodes: int, resources: list[dict] | None = None) -> tuple:
    """A head with no CPUs and `nodes` worker nodes of one CPU (with `resources[i]`, custom resources, if given),
    this process connected and Serve's proxy on the head; the app's args for a tiny model, on storage every node
    shares. Returns (cluster, port, args, tmp dir)."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    os.environ.update(PROXY_ENV)  # before Ray starts: Serve's proxy inherits it
    tmp = Path(tempfile.mkdtemp())
    model_dir = build_model_dir(tmp / "model", "qwen2")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_DETECTION})
    for i in range(nodes):
        cluster.add_node(num_cpus=1, resources=resources[i] if resources else None)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    args = app_args(model_dir, f"file://{tmp / 'storage'}")
    args["shared_storage"] = True  # every "node" is this host
    return cluster, port, args, tmp


def write_and_stop(out: str, figures: dict, cluster) -> None:
    """The figures to `out` (and stdout); Serve, Ray and the cluster stopped."""
    import ray
    from ray import serve

    Path(out).write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


def main(out: str) -> None:
    from ray import serve

    from deployments import build_openai_app

    both = {"model_slot": 1, "ingress_slot": 1}
    cluster, port, args, tmp = start_cluster(3, [both, {"ingress_slot": 1}, {"model_slot": 1}])
    args["llm_configs"][0]["engine_kwargs"] = {"max_model_len": 2048, "kv_cache_bytes": 256 << 20}
    args["llm_configs"][0]["deployment_config"] = {
        "num_replicas": 2, "health_check_period_s": 1,
        "ray_actor_options": {"num_cpus": 1, "resources": {"model_slot": 1}}}
    args["ingress_deployment_config"] = {"num_replicas": 2, "ray_actor_options": {"resources": {"ingress_slot": 1}}}
    args["start_batch_manager"] = True  # it runs from the start, on an ingress replica's node if Ray places it so
    started = time.monotonic()
    serve.run(build_openai_app(args), name="default", route_prefix="/")
    cluster.add_node(num_cpus=1, resources=both)  # where what the node losses take is rebuilt
    base_url = f"http://127.0.0.1:{port}"
    figures = {"startup_s": round(time.monotonic() - started, 1)}
    figures["replica_node_killed"] = replica_loss(cluster, base_url)
    figures["ingress_node_killed"] = ingress_loss(cluster, base_url)
    figures["batch_manager_killed"] = manager_loss(base_url, tmp / "storage")
    write_and_stop(out, figures, cluster)


if __name__ == "__main__":
    main(sys.argv[1])
