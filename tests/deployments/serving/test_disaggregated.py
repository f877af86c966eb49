"""Prefill/decode disaggregation served (`prefill_config`): a chat, whole and streamed, answers as the offline
engine does; under 50 concurrent chats the decode side fetches at least 95% of each prompt's blocks (a prefill
answers once the shared tier's directory holds them); the admin routes pause, update and resume the prefill
replicas as well as the decode ones."""

import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
from ray import serve

from deployments.app_config import replica_name
from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args
from tests.runtime.test_greedy_parity import WORDS

ADMIN_KEY = "pd-admin-key-0123456789"
BLOCK = 16  # the engine's block size


@pytest.fixture(scope="module")
def pd_app(server, tmp_path_factory):
    tier = {"size_gib": 0.05, "name": f"pd-{uuid.uuid4()}", "min_prompt_tokens": 256}
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('pd')}")
    config = args["llm_configs"][0]
    config["engine_kwargs"] = {**ENGINE_KWARGS, "warm_up": False, "kv_offloading_size": 0.05, "kv_shared_tier": tier}
    config["prefill_config"] = {"deployment_config": {"max_ongoing_requests": 8}}
    args["admin_api_key"] = ADMIN_KEY
    with another_app(server, "pd", args) as url:
        yield url


def _stats() -> dict[bool, dict]:
    """The decode (False) and prefill (True) replica's engine stats."""
    return {side: serve.get_deployment_handle(replica_name(MODEL_ID, side), app_name="pd").stats.remote().result()
            for side in (False, True)}


def _chat(url: str, content: str, **options):
    client = openai.Client(base_url=f"{url}/v1", api_key="None", max_retries=0)
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=16, **options)


def test_a_disaggregated_chat_answers_as_the_offline_engine(server, pd_app):
    content = " ".join(WORDS * 12)  # some 300 tokens
    offline = LLM(str(server.model_dir), **ENGINE_KWARGS).chat([{"role": "user", "content": content}],
                                                               SamplingParams(temperature=0, max_tokens=16))
    whole = _chat(pd_app, content)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in _chat(pd_app, content, stream=True)
                       if chunk.choices)
    stats = _stats()
    assert whole.choices[0].message.content == streamed == offline[0].outputs[0].text
    assert whole.usage.prompt_tokens >= 256 and whole.usage.prompt_tokens_details.cached_tokens >= 256 - 16
    assert stats[True]["kv_shared_published_blocks"] > 0 and stats[False]["kv_shared_fetched_blocks"] > 0


def test_the_decode_side_fetches_what_each_prefill_published(pd_app):
    """50 chats at once, each of its own prompt: every prompt's blocks (but the one holding its last token) come
    from the prefill replica, at least 95% of them, and the published counter counts blocks the directory took."""
    published_before = _stats()[True]["kv_shared_published_blocks"]
    prompts = [f"request {i}: " + " ".join(WORDS[i % len(WORDS):] + WORDS * 12) for i in range(50)]
    with ThreadPoolExecutor(50) as pool:
        replies = list(pool.map(lambda p: _chat(pd_app, p), prompts))
    for reply in replies:
        full_blocks = (reply.usage.prompt_tokens - 1) // BLOCK * BLOCK
        assert reply.usage.prompt_tokens_details.cached_tokens >= 0.95 * full_blocks, reply.usage
    published = _stats()[True]["kv_shared_published_blocks"] - published_before
    assert published == sum((r.usage.prompt_tokens - 1) // BLOCK for r in replies)


def _admin(url: str, route: str, body: dict | None = None):
    response = requests.post(f"{url}/{route}", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                             timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _states() -> list[dict]:
    return [serve.get_deployment_handle(replica_name(MODEL_ID, side), app_name="pd").lifecycle_state.remote()
            .result() for side in (False, True)]


def test_admin_routes_reach_the_prefill_replicas(server, pd_app, tmp_path):
    """Pause, a trainer's checkpoint under its version, and resume reach both deployments; the chat then answers
    on the new weights, as a fresh engine on them does."""
    trained = build_model_dir(tmp_path / "trained", "qwen2", seed=1)
    assert _admin(pd_app, "pause", {"mode": "keep"})["replicas"] == 2
    assert [state["paused"] for state in _states()] == [True, True]
    assert _admin(pd_app, "update_weights_from_disk", {"model_path": str(trained), "weight_version": "step-1"})
    decode, prefill = _states()
    assert decode["weight_version"] == prefill["weight_version"] != ""
    _admin(pd_app, "resume")
    assert [state["paused"] for state in _states()] == [False, False]
    content = " ".join(WORDS * 12)
    expected = LLM(str(trained), **ENGINE_KWARGS).chat([{"role": "user", "content": content}],
                                                       SamplingParams(temperature=0, max_tokens=16))
    reply = _chat(pd_app, content)
    assert reply.choices[0].message.content == expected[0].outputs[0].text
    assert reply.usage.prompt_tokens_details.cached_tokens >= (reply.usage.prompt_tokens - 1) // BLOCK * BLOCK
