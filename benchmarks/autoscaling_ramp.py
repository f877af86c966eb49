"""A simulated day (low, peak, low traffic) against one app twice: autoscaled by the latency-target policy
(deployments/autoscaling.py) and by Serve's rule on `target_ongoing_requests`; replicas over time and TTFT p90
against the target, side by side, as JSON lines and a plot.

    python -m benchmarks.autoscaling_ramp [--out docs/autoscaling_ramp.png]

Each user is a closed loop of streamed chats (32 tokens out); TTFT is the client's (from sending to the first
content chunk). The replicas share the machine's cores, so on a small CPU machine a second
replica answers the same load no faster: the run shows when each policy adds and removes replicas, not what the
extra replicas buy. On CPU each replica takes one core.
"""

import argparse
import asyncio
import json
import os
import random
import threading
import time
from pathlib import Path

import openai

from benchmarks.batch_throughput import serving_app
from benchmarks.common import build_cpu_model, report
from benchmarks.online_serving import MODEL_ID, local_config_args

# (name, seconds, concurrent users, words per prompt): the peak is a few users with long prompts, which
# `target_ongoing_requests` reads as little load
PHASES = (("low", 60, 1, 200), ("peak", 90, 3, 800), ("low", 90, 1, 200))
TTFT_TARGET_S = 1.5
WINDOW_S = 10  # TTFT p90 is reported per window of this many seconds
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 5, "downscale_delay_s": 20,
               "metrics_interval_s": 1, "look_back_period_s": 5}
POLICIES = {
    "latency": {**AUTOSCALING, "target_ongoing_requests": 4, "policy": {
        "policy_function": "deployments.autoscaling:LatencyTargetPolicy",
        "policy_kwargs": {"ttft_p90_s": TTFT_TARGET_S}}},
    "ongoing_requests": {**AUTOSCALING, "target_ongoing_requests": 4},
}


def app_args(path: Path, autoscaling: dict) -> dict:
    args = local_config_args(path, direct_streaming=False)
    llm = args["llm_configs"][0]
    llm["engine_kwargs"].pop("engine_process", None)  # a replica's one core runs its engine's thread
    llm["engine_kwargs"]["max_model_len"] = 4096
    llm["deployment_config"] = {"autoscaling_config": autoscaling, "ray_actor_options": {"num_cpus": 1}}
    args["ingress_deployment_config"] = {"num_replicas": 1}
    return args


def running_replicas() -> int:
    from ray import serve

    from deployments.app_config import replica_name

    status = serve.status().applications["default"].deployments[replica_name(MODEL_ID)]
    return status.replica_states.get("RUNNING", 0)


async def day(url: str, started: float) -> list[tuple[float, float]]:
    """The day's (time since start, TTFT) of every chat."""
    client = openai.AsyncClient(base_url=url, api_key="none", max_retries=0, timeout=300)
    rng = random.Random(0)
    words = "alpha beta gamma delta river stone cloud ember frost grove harbor island".split()
    samples = []

    async def user(until: float, length: int):
        while time.monotonic() < until:
            prompt = " ".join(rng.choice(words) for _ in range(length))
            sent = time.monotonic()
            stream = await client.chat.completions.create(model=MODEL_ID, max_tokens=32, stream=True,
                                                          messages=[{"role": "user", "content": prompt}],
                                                          extra_body={"ignore_eos": True})
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic()
            samples.append((sent - started, (first or time.monotonic()) - sent))

    for _, seconds, users, length in PHASES:
        until = time.monotonic() + seconds
        await asyncio.gather(*(user(until, length) for _ in range(users)))
    return samples


def run(path: Path, policy: str) -> dict:
    with serving_app(app_args(path, POLICIES[policy])) as base:
        replicas, stop = [], threading.Event()
        started = time.monotonic()

        def sample():
            while not stop.wait(1):
                replicas.append((round(time.monotonic() - started, 1), running_replicas()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ttfts = asyncio.run(day(f"{base}/v1", started))
        stop.set()
        sampler.join()
    windows = {}
    for at, ttft in ttfts:
        windows.setdefault(int(at // WINDOW_S) * WINDOW_S, []).append(ttft)
    p90 = {start: sorted(v)[max(0, -(-9 * len(v) // 10) - 1)] for start, v in sorted(windows.items())}
    bounds, phases = 0, {}
    for name, seconds, _, _ in PHASES:
        inside = [t for at, t in ttfts if bounds <= at < bounds + seconds]
        counts = [n for at, n in replicas if bounds <= at < bounds + seconds]
        phases[f"{name}@{bounds}s"] = {"ttft_p90_s": round(sorted(inside)[-(-9 * len(inside) // 10) - 1], 3),
                                      "replicas_max": max(counts), "replicas_mean": round(sum(counts) / len(counts), 2)}
        bounds += seconds
    report("autoscaling_ramp", policy=policy, ttft_target_s=TTFT_TARGET_S, phases=phases)
    return {"replicas": replicas, "ttft_p90": p90}


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for policy, result in results.items():
        top.step(*zip(*result["replicas"]), where="post", label=policy)
        bottom.plot([s + WINDOW_S / 2 for s in result["ttft_p90"]], list(result["ttft_p90"].values()), marker="o",
                    label=policy)
    bottom.axhline(TTFT_TARGET_S, color="gray", linestyle="--", label="TTFT p90 target")
    bounds = 0
    for name, seconds, users, length in PHASES:
        for axis in (top, bottom):
            axis.axvline(bounds, color="lightgray", linewidth=0.8)
        top.text(bounds + 2, 2.05, f"{name}: {users} x {length} words", fontsize=8)
        bounds += seconds
    top.set_ylabel("running replicas")
    top.set_ylim(0, 2.4)
    bottom.set_ylabel(f"TTFT p90 per {WINDOW_S} s (s)")
    bottom.set_xlabel("seconds")
    top.legend(loc="upper right")
    bottom.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/autoscaling_ramp.png"))
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    args = parser.parse_args()
    path = build_cpu_model()
    results = {policy: run(path, policy) for policy in args.policies}
    print(json.dumps({"cpus": os.cpu_count(), **{p: r["replicas"] for p, r in results.items()}}))
    plot(results, args.out)


if __name__ == "__main__":
    main()
