"""/metrics carries Ray-exported request, latency, token and cache figures that move with traffic."""

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
        ttft = _total(after, "ray_rayllm_time_to_first_token_seconds_count")
        cached = _total(after, "ray_rayllm_tokens_total", kind="cached")
        requests_ok = _total(after, "ray_rayllm_requests_total", route="/v1/chat/completions", status="200")
        return (ttft >= _total(before, "ray_rayllm_time_to_first_token_seconds_count") + 3
                and cached > _total(before, "ray_rayllm_tokens_total", kind="cached")
                and requests_ok >= _total(before, "ray_rayllm_requests_total", route="/v1/chat/completions",
                                          status="200") + 3
                and after)

    after = wait_until(moved, timeout=60, every=1)  # Ray exports on an interval
    assert _total(after, "ray_rayllm_prefix_cache_hit_rate") > 0
    assert "ray_rayllm_kv_cache_usage" in {k.split("{")[0] for k in after}
    assert _total(after, "ray_rayllm_inter_token_latency_seconds_count") > 0
