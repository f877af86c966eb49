"""/metrics carries Ray-exported request, latency, token and cache figures that move by what traffic sent, vLLM's
under vLLM's names."""

import re
import time

import openai
import ray
import requests

from testing.helpers import wait_until
from tests.conftest import MODEL_ID


def _samples(base_url: str) -> dict[str, float]:
    text = requests.get(f"{base_url}/metrics").text
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^(\S+?)(\{.*\})? ([0-9.e+-]+)$", line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def _total(samples: dict[str, float], name: str, **labels) -> float:
    """The shared app's figures only: apps other tests ran beside it stop being exported once deleted."""
    labels.setdefault("application", "default")
    return sum(v for k, v in samples.items()
               if k.split("{")[0] == name and all(f'{lk}="{lv}"' in k for lk, lv in labels.items()))


def _settled(base_url: str) -> dict[str, float]:
    """/metrics once the ingress's chat counter has held still for longer than Ray's export interval: the
    requests earlier tests sent are all counted, so what moves after is this test's."""
    seen = {"value": None, "since": time.monotonic()}

    def still() -> dict | None:
        samples = _samples(base_url)
        value = _total(samples, "ray_rayllm_requests_total", route="/v1/chat/completions")
        if value != seen["value"]:
            seen.update(value=value, since=time.monotonic())
        return samples if time.monotonic() - seen["since"] > ray._config.metrics_report_interval_ms() / 1000 else None

    return wait_until(still, timeout=120, every=1)


def test_metrics_count_what_was_sent(server):
    """Three chats: each counter moves by exactly what their replies say (requests, first tokens, finishes,
    prompt, generated and cached tokens), once Ray has exported them."""
    before = _settled(server.base_url)
    client = openai.Client(base_url=server.openai_url, api_key="None")
    system = "You are a meticulous assistant that answers in short sentences. " * 6
    replies = [client.chat.completions.create(  # each to its max_tokens: finished by "length"
        model=MODEL_ID, max_tokens=4, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
        for question in ("one", "two", "three")]
    cached = sum(r.usage.prompt_tokens_details.cached_tokens for r in replies)
    expected = {
        ("vllm:time_to_first_token_seconds_count", ()): 3,
        ("ray_rayllm_requests_total", (("route", "/v1/chat/completions"), ("status", "200"))): 3,
        ("vllm:request_success_total", (("finished_reason", "length"),)): 3,
        ("vllm:prompt_tokens_total", ()): sum(r.usage.prompt_tokens for r in replies),
        ("vllm:generation_tokens_total", ()): sum(r.usage.completion_tokens for r in replies),
        ("ray_rayllm_cached_prompt_tokens_total", ()): cached,
        ("vllm:prefix_cache_hits_total", ()): cached,
    }
    assert cached > 0  # the system prompt's blocks were hit

    def moved_by(after: dict) -> dict:
        return {key: _total(after, key[0], **dict(key[1])) - _total(before, key[0], **dict(key[1]))
                for key in expected}

    def exported() -> dict | None:
        after = _samples(server.base_url)
        return after if all(moved_by(after)[key] >= value for key, value in expected.items()) else None

    try:
        after = wait_until(exported, timeout=60, every=1)
    except AssertionError:
        raise AssertionError(f"moved by {moved_by(_samples(server.base_url))}, expected {expected}") from None
    assert moved_by(after) == expected  # Ray exports on an interval: waited for, then exact
    names = {k.split("{")[0] for k in after}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_bucket",
            "vllm:prefix_cache_queries_total"} <= names
    assert _total(after, "vllm:inter_token_latency_seconds_count", model_name=MODEL_ID) > 0
    assert _total(after, "vllm:request_success_total", finished_reason="length") >= 3
    assert not any(name.startswith("ray_vllm_") for name in names)  # vLLM's spelling on /metrics
