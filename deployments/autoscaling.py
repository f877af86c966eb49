"""Autoscaling a model's replicas on latency targets: a policy for Serve's custom autoscaling API.

    deployment_config:
      autoscaling_config:
        min_replicas: 1
        max_replicas: 8
        target_ongoing_requests: 16          # the fallback, and the floor a scale-down respects
        upscale_delay_s: 10
        downscale_delay_s: 120
        policy:
          policy_function: deployments.autoscaling:LatencyTargetPolicy
          policy_kwargs: {ttft_p90_s: 1.0, itl_p90_s: 0.1}

`target_ongoing_requests` is a proxy that long prompts and long outputs both defeat; what users feel is the time
to the first token and between tokens. Each replica reports the p90 of both over its last seconds, the longest
wait of a request still without its first token as a floor under TTFT (`LLMServer.record_autoscaling_stats`);
Serve averages each replica's figures over `look_back_period_s`. Over a
target, the policy asks for replicas in proportion to the worst overshoot (at most twice as many at once); well
under both (below `headroom` of each), it gives back one replica at a time, and only while the ongoing requests
would still be under `target_ongoing_requests` per replica; between the two it holds. With no latency measured
(an idle window, a first start) it is Serve's own rule on ongoing requests. Serve applies the delays, the scaling
factors and the replica bounds on top, which keeps it from flapping.

The policy runs in Serve's controller; its figures and decisions are gauges there (`rayllm_autoscaling_*`, by
application and deployment), in Ray's metrics export and on `GET /metrics` of the node that runs the controller.
"""

import math

from ray.serve.config import AutoscalingContext
from ray.util.metrics import Gauge

from deployments.metrics import metric

MAX_STEP = 2.0  # a scale-up asks for at most this many times the running replicas at once
_TAGS = ("application", "deployment")
# why the policy asked for what it did: no latency measured (Serve's rule on ongoing requests), a target
# exceeded, both well met, or in between
REASONS = ("load", "over_target", "under_target", "hold")


class LatencyTargetPolicy:
    def __init__(self, ttft_p90_s: float | None = None, itl_p90_s: float | None = None, headroom: float = 0.5):
        """Targets in seconds (one at least); `headroom`: the fraction of each target under which replicas may go."""
        if ttft_p90_s is None and itl_p90_s is None:
            raise ValueError("LatencyTargetPolicy: give ttft_p90_s, itl_p90_s or both")
        if any(t is not None and t <= 0 for t in (ttft_p90_s, itl_p90_s)) or not 0 < headroom < 1:
            raise ValueError("LatencyTargetPolicy: targets must be positive and headroom within (0, 1)")
        self.targets = {"ttft_p90_s": ttft_p90_s, "itl_p90_s": itl_p90_s}
        self.headroom = headroom

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict]:
        running = max(ctx.current_num_replicas, 1)
        by_load = ctx.total_num_requests / ctx.config.get_target_ongoing_requests()
        figures = self.figures(ctx.aggregated_metrics or {})
        ratios = [figures[name] / target for name, target in self.targets.items() if target and name in figures]
        if not ratios:
            desired, reason = by_load, "load"
        elif max(ratios) > 1:
            desired, reason = running * min(max(ratios), MAX_STEP), "over_target"
        elif max(ratios) < self.headroom and by_load <= running - 1:
            desired, reason = running - 1, "under_target"
        else:
            desired, reason = running, "hold"
        self._report(ctx, figures, desired, reason)
        return desired, {}

    @staticmethod
    def figures(metrics: dict[str, dict]) -> dict[str, float]:
        """Each latency figure's mean over the replicas that reported it."""
        return {name: sum(values.values()) / len(values) for name, values in metrics.items()
                if name.endswith("_p90_s") and values}

    def _report(self, ctx: AutoscalingContext, figures: dict[str, float], desired: float, reason: str) -> None:
        tags = {"application": ctx.app_name or "", "deployment": ctx.deployment_name}
        for name, value in figures.items():
            metric(Gauge, f"rayllm_autoscaling_{name.removesuffix('_s')}_seconds",
                   f"The replicas' mean {name.split('_')[0].upper()} p90, as the autoscaler read it", _TAGS
                   ).set(value, tags=tags)
        metric(Gauge, "rayllm_autoscaling_desired_replicas", "Replicas the latency policy asked for, before Serve's "
               "delays and bounds", _TAGS).set(math.ceil(desired), tags=tags)
        decision = metric(Gauge, "rayllm_autoscaling_decision", "The latency policy's last decision: 1 for its "
                          "reason", (*_TAGS, "reason"))
        for each in REASONS:
            decision.set(float(each == reason), tags={**tags, "reason": each})
