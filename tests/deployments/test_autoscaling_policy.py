"""The latency-target autoscaling policy's decisions on Serve's own `AutoscalingContext`: a target exceeded asks for
replicas in proportion (at most twice as many at once), both targets well met give one back while the load
allows, between the two it holds, and with no latency measured it is the ongoing-requests rule; the replica's
latency window reports p90s over its last seconds only, with the oldest wait for a first token as a floor."""

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.autoscaling import LatencyTargetPolicy
from deployments.replica.latency_window import LatencyWindow

DEPLOYMENT = DeploymentID("LLMServer:model", "default")


def _context(replicas: int, ongoing: float, **figures: list[float]) -> AutoscalingContext:
    """`figures`: each latency figure, one value per replica."""
    ids = [ReplicaID(f"r{i}", DEPLOYMENT) for i in range(replicas)]
    config = AutoscalingConfig(min_replicas=1, max_replicas=8, target_ongoing_requests=4)
    return AutoscalingContext(
        deployment_id=DEPLOYMENT, deployment_name=DEPLOYMENT.name, app_name="default", current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=ids, total_num_requests=ongoing, total_queued_requests=0,
        aggregated_metrics={name: dict(zip(ids, values)) for name, values in figures.items()}, raw_metrics={},
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={}, last_scale_up_time=None,
        last_scale_down_time=None, current_time=0.0, config=config)


POLICY = LatencyTargetPolicy(ttft_p90_s=1.0, itl_p90_s=0.1)


@pytest.mark.parametrize(("replicas", "ongoing", "figures", "desired"), [
    (2, 8, {"ttft_p90_s": [1.4, 1.6], "itl_p90_s": [0.05, 0.05]}, 3.0),  # TTFT 1.5x its target
    (2, 8, {"ttft_p90_s": [0.2, 0.2], "itl_p90_s": [0.3, 0.3]}, 4.0),  # ITL 3x: at most twice the replicas
    (1, 0, {"ttft_p90_s": [2.0]}, 2.0),  # one figure reported: judged on it
    (3, 4, {"ttft_p90_s": [0.1, 0.2, 0.3], "itl_p90_s": [0.01, 0.02, 0.03]}, 2),  # well met, little load
    (3, 10, {"ttft_p90_s": [0.1, 0.2, 0.3], "itl_p90_s": [0.01, 0.02, 0.03]}, 3),  # well met, the load needs 3
    (3, 4, {"ttft_p90_s": [0.6, 0.7, 0.8], "itl_p90_s": [0.01, 0.02, 0.03]}, 3),  # between: hold
    (2, 12, {}, 3.0),  # nothing measured: ongoing requests / target_ongoing_requests
])
def test_decisions(replicas, ongoing, figures, desired):
    assert POLICY(_context(replicas, ongoing, **figures)) == (desired, {})


def test_targets_are_checked():
    for kwargs in ({}, {"ttft_p90_s": 0}, {"itl_p90_s": -1}, {"ttft_p90_s": 1, "headroom": 1}):
        with pytest.raises(ValueError, match="LatencyTargetPolicy"):
            LatencyTargetPolicy(**kwargs)


def test_the_window_reports_recent_p90s():
    window = LatencyWindow(window_s=3600)
    assert window.p90s() == {}
    for i in range(1, 11):
        window.add("ttft", i / 10)
    window.add("itl", 0.05)
    assert window.p90s() == {"ttft_p90_s": 0.9, "itl_p90_s": 0.05}
    assert window.p90s(oldest_wait=0.5) == {"ttft_p90_s": 0.9, "itl_p90_s": 0.05}  # a floor only
    assert window.p90s(oldest_wait=30.0) == {"ttft_p90_s": 30.0, "itl_p90_s": 0.05}  # an overload, before its tokens
    window.window_s = 0  # every sample is older than the window
    assert window.p90s() == {}
    assert window.p90s(oldest_wait=2.0) == {"ttft_p90_s": 2.0}
