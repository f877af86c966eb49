"""/metrics carries Ray-exported request, latency, token and cache figures that move with traffic, vLLM's under
vLLM's names."""

import re

import openai
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
    return sum(v for k, v in samples.items()
               if k.split("{")[0] == name and all(f'{lk}="{lv}"' in k for lk, lv in labels.items()))


def test_metrics_move_after_requests(server):
    before = _samples(server.base_url)
    client = openai.Client(base_url=server.openai_url, api_key="None")
    system = "You are a meticulous assistant that answers in short sentences. " * 6
    for question in ("one", "two", "three"):
        client.chat.completions.create(model=MODEL_ID, max_tokens=4, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": question}])

    def moved():
        after = _samples(server.base_url)
        ttft = _total(after, "vllm:time_to_first_token_seconds_count")
        cached = _total(after, "ray_rayllm_cached_prompt_tokens_total")
        requests_ok = _total(after, "ray_rayllm_requests_total", route="/v1/chat/completions", status="200")
        return (ttft >= _total(before, "vllm:time_to_first_token_seconds_count") + 3
                and cached > _total(before, "ray_rayllm_cached_prompt_tokens_total")
                and requests_ok >= _total(before, "ray_rayllm_requests_total", route="/v1/chat/completions",
                                          status="200") + 3
                and _total(after, "vllm:prefix_cache_hits_total") > _total(before, "vllm:prefix_cache_hits_total")
                and after)

    after = wait_until(moved, timeout=60, every=1)  # Ray exports on an interval
    names = {k.split("{")[0] for k in after}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_bucket",
            "vllm:prefix_cache_queries_total"} <= names
    assert _total(after, "vllm:inter_token_latency_seconds_count", model_name=MODEL_ID) > 0
    assert _total(after, "vllm:request_success_total", finished_reason="length") >= 3
    assert not any(name.startswith("ray_vllm_") for name in names)  # vLLM's spelling on /metrics
