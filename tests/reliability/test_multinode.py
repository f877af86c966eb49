"""Losing a node costs only what ran on it, on a real multi-node Ray cluster (see multinode_cluster.py,
pipeline_cluster.py and shared_tier_cluster.py, which run in processes of their own: one Ray cluster per
process). The figures are printed as one JSON line."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.reliability


def test_node_losses_cost_only_what_ran_on_them(tmp_path):
    out = tmp_path / "figures.json"
    subprocess.run([sys.executable, "-m", "tests.reliability.multinode_cluster", str(out)], check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    figures = json.loads(out.read_text())
    print(json.dumps({"reliability": "multinode", **figures}))

    replica_loss = figures["replica_node_killed"]  # with an ingress replica and the batch manager, if it ran it
    assert replica_loss["victim_ran_ingress"]
    streams, new_requests = replica_loss["streams"], replica_loss["new_requests"]
    assert sum(streams.values()) == 20 and set(streams) <= {"completed", "error_event"}
    assert streams.get("error_event", 0) >= 1  # the killed node had streams: they ended in shape
    # every new request answered; the slowest waited for Ray's verdict on the node (2 s here) and a retry
    assert new_requests["failed"] == 0 and new_requests["max_s"] <= 6.0

    ingress_loss = figures["ingress_node_killed"]
    assert ingress_loss["ingress_nodes_before"] == ingress_loss["distinct_ingress_nodes_before"] == 2
    assert ingress_loss["new_requests"]["failure_window_s"] <= 2.0

    batch = figures["batch_manager_killed"]
    assert batch["all_present"] and batch["output_lines"] == batch["unique_custom_ids"] == 300


def test_a_replica_over_two_nodes_serves_and_loses_only_its_streams_with_a_stage(tmp_path):
    """Two replicas of two pipeline stages, each stage on a node of its own; one stage's node is killed under load:
    that replica's streams end with an error event, every new request is answered by the other replica (p99 under
    2 s), and Serve rebuilds the lost replica on the nodes left (pipeline_cluster.py)."""
    out = tmp_path / "figures.json"
    subprocess.run([sys.executable, "-m", "tests.reliability.pipeline_cluster", str(out)], check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    figures = json.loads(out.read_text())
    print(json.dumps({"reliability": "pipeline_multinode", **figures}))
    assert figures["stage_nodes_per_replica"] == [2, 2] and figures["sdk_chat_tokens"] == 8
    loss = figures["stage_node_killed"]
    streams, new_requests = loss["streams"], loss["new_requests"]
    assert sum(streams.values()) == 20 and set(streams) <= {"completed", "error_event"}
    assert streams.get("error_event", 0) >= 1 and streams.get("completed", 0) >= 1
    assert new_requests["failed"] == 0 and new_requests["max_s"] <= 6.0
    assert loss["replica_rebuilt_after_s"] is not None


def test_the_shared_kv_tier_outlives_its_directorys_node_and_a_publishers(tmp_path):
    """Engines on nodes of their own share a tier whose directory sits on a third node (shared_tier_cluster.py):
    killing the directory's node, then the publisher's, fails no request; the tier comes back and serves again,
    the survivor keeps what it holds and computes what only the dead node had."""
    out = tmp_path / "figures.json"
    subprocess.run([sys.executable, "-m", "tests.reliability.shared_tier_cluster", str(out)], check=True,
                   timeout=600, stdout=subprocess.DEVNULL)
    figures = json.loads(out.read_text())
    print(json.dumps({"reliability": "shared_tier_multinode", **figures}))
    full = (1000 - 1) // 16 * 16
    cached = {step: figures[step]["cached"] for step in figures}
    assert cached == {"a_computes": 0, "b_from_tier": full, "b_while_directory_restarts": 0,
                      "a_publishes_again": 0, "b_from_restarted_tier": full, "a_publishes_before_its_loss": 0,
                      "b_own_cache_after_a_lost": full, "b_computes_what_only_a_had": 0}
    assert figures["a_computes"]["tokens"] == figures["b_from_tier"]["tokens"]
    assert figures["a_publishes_before_its_loss"]["tokens"] == figures["b_computes_what_only_a_had"]["tokens"]
    assert figures["b_while_directory_restarts"]["seconds"] < 10  # a lookup waits 2 s at most
    assert figures["b_computes_what_only_a_had"]["seconds"] < 20  # a fetch waits 10 s at most
