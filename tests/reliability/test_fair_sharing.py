"""One tenant cannot starve another: with two API keys, a request of 1,024 sequences from one key (8 prompts x n
128, 50 tokens each) holds the engine while the other key's 4-token chat is answered within NORMAL_BOUND_S (two
cores), and the big request still completes whole. Figures are printed as one JSON line."""

import concurrent.futures
import json
import time

import pytest
import requests
from ray import serve

from deployments.app_config import replica_name
from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args

pytestmark = pytest.mark.reliability
NORMAL_BOUND_S = 1.0


def test_a_key_with_a_thousand_sequences_does_not_hold_up_another_key(server, tmp_path):
    args = {**app_args(server.model_dir, f"file://{tmp_path}"), "api_key": ["sk-big", "sk-small"]}
    with another_app(server, "fair", args) as base_url:
        stats = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="fair").stats
        big_body = {"model": MODEL_ID, "prompt": [[5, 6]] * 8, "n": 128, "max_tokens": 50, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            big = pool.submit(requests.post, f"{base_url}/v1/completions", json=big_body, timeout=600,
                              headers={"Authorization": "Bearer sk-big"})
            wait_until(lambda: stats.remote().result()["num_running"] >= 64, timeout=120, every=0.05)
            start = time.monotonic()
            small = requests.post(f"{base_url}/v1/chat/completions", timeout=120, headers={
                "Authorization": "Bearer sk-small"}, json={"model": MODEL_ID, "max_tokens": 4, "ignore_eos": True,
                                                           "messages": [{"role": "user", "content": "hi"}]})
            small_s = time.monotonic() - start
            waiting = stats.remote().result()["num_waiting"]
            reply = big.result()
    assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 4, small.text
    assert reply.status_code == 200, reply.text[:300]
    choices = reply.json()["choices"]
    assert len(choices) == 1024 and all(len(c["text"]) > 0 and c["finish_reason"] == "length" for c in choices)
    assert reply.json()["usage"]["completion_tokens"] == 1024 * 50
    print(json.dumps({"reliability": "fair_sharing", "small_chat_s": round(small_s, 3),
                      "big_request_waiting_when_answered": waiting}))
    assert waiting > 0, "the big request must still have been queued when the small chat was answered"
    assert small_s <= NORMAL_BOUND_S
