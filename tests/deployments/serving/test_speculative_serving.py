"""Served with speculation (and a KV offload tier) on: a greedy chat stream through the `openai` SDK is
token-identical to one without, and /metrics carries the acceptance figures and the tier's."""

import openai
import requests

from testing.helpers import wait_until
from testing.model_factory import build_model_dir
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def _stream(url: str, messages: list[dict]) -> tuple[list[str], str]:
    client = openai.Client(base_url=f"{url}/v1", api_key="None")
    tokens, text = [], ""
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=60,
                                                stream=True, logprobs=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            tokens += [t.token for t in (choice.logprobs.content if choice.logprobs else None) or []]
    return tokens, text


def test_greedy_chat_stream_is_token_identical_with_speculation(server, tmp_path_factory):
    from ray import serve

    from deployments.app_config import replica_name

    model_dir = build_model_dir(tmp_path_factory.mktemp("copy_model"), "qwen2", init_std=0.02)  # repeats itself
    plain_args = app_args(model_dir, f"file://{tmp_path_factory.mktemp('plain')}")
    spec_args = app_args(model_dir, f"file://{tmp_path_factory.mktemp('spec')}")
    spec_args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "speculative_config": NGRAM,
                                                    "kv_offloading_size": 0.01}
    conversations = [[{"role": "user", "content": f"Repeat after me {i} times: the sky is blue, the sea is deep."}]
                     for i in range(3)]
    with another_app(server, "plain", plain_args) as url:
        expected = [_stream(url, m) for m in conversations]
    with another_app(server, "spec", spec_args) as url:
        assert [_stream(url, m) for m in conversations] == expected
        stats = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="spec").stats.remote().result()
        assert stats["spec_num_accepted_tokens"] > 0

        def exported():
            text = requests.get(f"{server.base_url}/metrics").text
            return all(f"ray_rayllm_{name}" in text for name in ("spec_decode_acceptance_rate",
                                                                  "spec_decode_num_draft_tokens",
                                                                  "kv_offload_capacity_bytes"))

        wait_until(exported, timeout=60, every=1)  # Ray exports on an interval
    assert all(len(tokens) == 60 or text for tokens, text in expected)
