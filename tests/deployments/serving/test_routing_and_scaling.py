"""Several replicas: prefix-aware routing keeps shared prefixes on one replica; autoscaling up and down
under load fails no request; a stopping replica's drain bound."""

import asyncio
import random
import time

import openai
from ray import serve

from deployments import build_openai_app
from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.app_config import replica_name
from deployments.builder import DRAIN_TIMEOUT_S, INGRESS_DRAIN_MARGIN_S
from deployments.route_marks import route_marks
from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args

WORDS = "alpha beta gamma delta river stone cloud ember frost grove harbor island jungle".split()
GROUPS = 20


def _conversations() -> list[list[dict]]:
    """Two requests for each of GROUPS long system prompts: the second can reuse the first's prefix."""
    rng = random.Random(0)
    systems = [" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(GROUPS)]
    return [[{"role": "system", "content": s}, {"role": "user", "content": f"question {turn}"}]
            for turn in range(2) for s in systems]


def _cached_tokens(base_url: str) -> int:
    client = openai.Client(base_url=base_url, api_key="None")
    return sum(client.chat.completions.create(model=MODEL_ID, messages=m, max_tokens=2)
               .usage.prompt_tokens_details.cached_tokens for m in _conversations())


def _app_args(server, storage, deployment_config: dict) -> dict:
    args = app_args(server.model_dir, f"file://{storage}")
    args["llm_configs"][0]["deployment_config"] = deployment_config
    return args


def test_prefix_aware_routing_reaches_the_single_replica_hit_rate(server, tmp_path):
    ideal = _cached_tokens(server.openai_url)  # one replica: every second request finds its prefix
    assert ideal > 0
    fleet = {}
    for name, router in [("prefix", {}), ("random", {"request_router_config": {
            "request_router_class": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"}})]:
        with another_app(server, name, _app_args(server, tmp_path / name, {"num_replicas": 2, **router})) as url:
            fleet[name] = _cached_tokens(f"{url}/v1")
    print(f"cached tokens: ideal {ideal}, prefix-aware {fleet['prefix']}, random {fleet['random']}")
    assert fleet["prefix"] >= 0.9 * ideal
    assert fleet["random"] < 0.85 * ideal  # about half: each group's two requests meet by chance


def test_a_replica_reports_the_route_marks_of_the_prompts_its_cache_holds(server, client):
    """What Serve hands the router of a replica (its record_routing_stats) names a chat's prefix once the replica
    has computed it, in the hashes the router reads off the request: its deepest and those at powers of two."""
    messages = [{"role": "system", "content": " ".join(WORDS * 5)}, {"role": "user", "content": "the first word?"}]
    marks = route_marks(ChatCompletionRequest(model=MODEL_ID, messages=messages))
    replica = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="default")
    assert len(marks) > 5 and not set(marks) & set(replica.record_routing_stats.remote().result()["prefix_marks"])
    client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=1)
    assert {marks[0], marks[1], marks[3], marks[-1]} <= set(replica.record_routing_stats.remote().result()[
        "prefix_marks"])


def _running_replicas(app: str) -> int:
    status = serve.status().applications[app].deployments[replica_name(MODEL_ID)]
    return status.replica_states.get("RUNNING", 0)


def test_autoscaling_up_and_down_under_load_fails_nothing(server, tmp_path):
    args = _app_args(server, tmp_path, {
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
                               "upscale_delay_s": 1, "downscale_delay_s": 3, "metrics_interval_s": 0.5,
                               "look_back_period_s": 2},
        "max_ongoing_requests": 16, "graceful_shutdown_timeout_s": 60})
    with another_app(server, "scaled", args) as base:
        url = f"{base}/v1"
        client = openai.AsyncClient(base_url=url, api_key="None", max_retries=0)
        outcomes = []

        async def stream(i: int):
            chunks = await client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": f"story {i}"}], max_tokens=48, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for chunk in chunks:
                if chunk.usage is not None:
                    outcomes.append(chunk.usage.completion_tokens)

        async def load(width: int, until):
            i = 0
            while not until():
                await asyncio.gather(*(stream(i + k) for k in range(width)))
                i += width

        async def scale_up_then_down() -> int:
            await load(12, lambda: _running_replicas("scaled") == 2)
            assert _running_replicas("scaled") == 2
            before = len(outcomes)
            # a light load keeps streams in flight while the fleet shrinks back to one replica
            await asyncio.wait_for(load(2, lambda: _running_replicas("scaled") == 1), timeout=120)
            return len(outcomes) - before

        assert _running_replicas("scaled") == 1
        during_scale_down = asyncio.run(scale_up_then_down())
        assert during_scale_down > 0
        assert len(outcomes) >= 48 and set(outcomes) == {48}  # every stream ran to the end


def test_killed_replica_fails_in_flight_fast_and_is_replaced(server, tmp_path):
    import ray
    import requests

    args = _app_args(server, tmp_path, {"num_replicas": 1, "health_check_period_s": 1})
    with another_app(server, "victim", args) as base:
        url = f"{base}/v1"
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "long story"}], "max_tokens": 400,
                "ignore_eos": True, "stream": True}
        started = time.monotonic()
        with requests.post(f"{url}/chat/completions", json=body, stream=True, timeout=60) as stream:
            lines = stream.iter_lines()
            next(lines)
            (replica,) = [a for a in ray.util.list_named_actors(all_namespaces=True)
                          if a["name"].startswith(f"SERVE_REPLICA::victim#{replica_name(MODEL_ID)}")]
            ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]))
            try:
                rest = b"\n".join(lines)
            except requests.RequestException:  # the connection may simply be cut
                rest = b""
        assert b"data: [DONE]" not in rest or b'"error"' in rest  # it did not complete as if nothing happened
        assert time.monotonic() - started < 30  # failed fast, no hang
        client = openai.Client(base_url=url, api_key="None", max_retries=0)

        def answers():
            try:
                return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=2).usage.completion_tokens >= 1
            except openai.APIError:
                return False

        wait_until(answers, timeout=180, every=1)


def _drain_bounds(args: dict) -> tuple[float, list[float]]:
    """The built app's ingress's and model replicas' `graceful_shutdown_timeout_s`."""
    ingress = build_openai_app(args)._bound_deployment
    models = ingress.init_args[1].values()
    return ingress._deployment_config.graceful_shutdown_timeout_s, [
        model._bound_deployment._deployment_config.graceful_shutdown_timeout_s for model in models]


def test_a_stopping_replica_drains_for_a_long_generation_and_the_ingress_for_longer(tmp_path):
    """Serve's own bound (20 s) would cut a long generation on every scale-down and redeploy; the ingress outlasts
    the replicas it streams from, so their streams end with the API's error event (tests/reliability/test_drain.py
    drains under load)."""
    args = app_args(tmp_path, f"file://{tmp_path}")
    assert _drain_bounds(args) == (DRAIN_TIMEOUT_S + INGRESS_DRAIN_MARGIN_S, [DRAIN_TIMEOUT_S])
    args["llm_configs"][0]["deployment_config"] = {"graceful_shutdown_timeout_s": 900}
    assert _drain_bounds(args) == (900 + INGRESS_DRAIN_MARGIN_S, [900])
    args["ingress_deployment_config"] = {"num_replicas": 1, "graceful_shutdown_timeout_s": 10}
    assert _drain_bounds(args) == (10, [900])


def test_the_latency_policy_scales_up_on_time_to_first_token(server, tmp_path):
    """A TTFT target no replica meets scales the model out where the ongoing-requests rule would not (its target is
    far above the load); the policy's figures and decision are on /metrics."""
    import requests

    args = _app_args(server, tmp_path, {"autoscaling_config": {
        "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 100, "upscale_delay_s": 1,
        "downscale_delay_s": 600, "metrics_interval_s": 0.5, "look_back_period_s": 2,
        "policy": {"policy_function": "deployments.autoscaling:LatencyTargetPolicy",
                   "policy_kwargs": {"ttft_p90_s": 0.001}}}})
    with another_app(server, "latency", args) as base:
        client = openai.AsyncClient(base_url=f"{base}/v1", api_key="None", max_retries=0)

        async def load():
            while _running_replicas("latency") < 2:
                await asyncio.gather(*(client.chat.completions.create(
                    model=MODEL_ID, messages=[{"role": "user", "content": f"question {k}"}], max_tokens=8)
                    for k in range(4)))

        assert _running_replicas("latency") == 1
        asyncio.run(asyncio.wait_for(load(), timeout=120))

        def reported():
            text = requests.get(f"{base}/metrics", timeout=10).text
            lines = [line for line in text.splitlines() if 'application="latency"' in line]
            return any(line.startswith("ray_rayllm_autoscaling_ttft_p90_seconds") for line in lines) and any(
                line.startswith("ray_rayllm_autoscaling_decision") and 'reason="over_target"' in line
                and line.endswith(" 1.0") for line in lines)

        wait_until(reported, timeout=60, every=1)
