"""Losing a node costs only what ran on it, on a real multi-node Ray cluster (see multinode_cluster.py, which
runs in its own process: one Ray cluster per process). The figures are printed as one JSON line."""

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

    replica_loss = figures["replica_node_killed"]
    streams, new_requests = replica_loss["streams"], replica_loss["new_requests"]
    assert sum(streams.values()) == 20 and "plain" not in streams and "unfinished" not in streams
    assert streams.get("error_event", 0) >= 1  # the killed node had streams: they ended in shape
    if replica_loss["victim_ran_ingress"]:  # the layout had no model-only node: streams through it may be cut
        assert new_requests["failure_window_s"] <= 2.0
    else:
        assert "cut" not in streams and new_requests["failed"] == 0

    ingress_loss = figures["ingress_node_killed"]
    assert ingress_loss["ingress_nodes_before"] == ingress_loss["distinct_ingress_nodes_before"] == 2
    assert ingress_loss["new_requests"]["failure_window_s"] <= 2.0

    batch = figures["batch_manager_killed"]
    assert batch["all_present"] and batch["output_lines"] == batch["unique_custom_ids"] == 300
