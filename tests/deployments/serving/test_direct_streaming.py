"""Direct streaming: the model's replica is the app's HTTP ingress; the same API, without the ingress hop."""

import anthropic
import openai
import pytest
import requests
from ray import serve

from deployments.app_config import DIRECT_STREAMING_ENV, parse_app_config, replica_name
from tests.conftest import MODEL_ID, another_app, app_args
from tests.deployments.batch.test_batches import chat_line, finished, jsonl, read_jsonl
from tests.deployments.serving.test_serving import assert_a_disconnect_frees_blocks
from tests.deployments.serving.test_serving_modes import assert_messages_create_and_stream

MESSAGES = [{"role": "user", "content": "List 3 countries and their capitals."}]


@pytest.fixture(scope="module")
def direct_url(server, tmp_path_factory):
    args = {**app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('direct-storage')}"),
            "direct_streaming": True}
    with another_app(server, "direct", args) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def direct(direct_url):
    return openai.Client(base_url=f"{direct_url}/v1", api_key="None")


def direct_stats() -> dict:
    return serve.get_deployment_handle(replica_name(MODEL_ID), app_name="direct").stats.remote().result()


def test_the_model_replica_is_the_only_deployment(direct_url):
    assert list(serve.status().applications["direct"].deployments) == [replica_name(MODEL_ID)]


def test_chat_and_its_stream_equal_the_ingress_apps(direct, client):
    expected = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=30)
    chat = direct.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=30)
    assert chat.choices[0].message.content == expected.choices[0].message.content
    assert chat.choices[0].finish_reason == expected.choices[0].finish_reason
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (expected.usage.prompt_tokens,
                                                                        expected.usage.completion_tokens)
    chunks = list(direct.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=30,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        chat.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_a_message_and_its_stream_through_the_anthropic_sdk(direct_url):
    assert_messages_create_and_stream(anthropic.Anthropic(base_url=direct_url, api_key="None"), MODEL_ID)


def test_completions_and_generate(direct, direct_url, client):
    expected = client.completions.create(model=MODEL_ID, prompt="The capital of France is", temperature=0,
                                         max_tokens=12, echo=True, logprobs=2)
    got = direct.completions.create(model=MODEL_ID, prompt="The capital of France is", temperature=0,
                                    max_tokens=12, echo=True, logprobs=2)
    assert got.choices[0].text == expected.choices[0].text
    assert got.choices[0].logprobs.tokens == expected.choices[0].logprobs.tokens
    reply = requests.post(f"{direct_url}/generate", json={
        "text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 12}}).json()
    assert reply["text"] == expected.choices[0].text[len("The capital of France is"):]
    assert reply["meta_info"]["completion_tokens"] == expected.usage.completion_tokens


def test_models_health_and_openai_errors(direct_url):
    assert [m["id"] for m in requests.get(f"{direct_url}/v1/models").json()["data"]] == [MODEL_ID]
    assert requests.get(f"{direct_url}/health").json() == {"status": "ok"}
    unknown = requests.post(f"{direct_url}/v1/chat/completions", json={"model": "nope", "messages": MESSAGES})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    empty = requests.post(f"{direct_url}/v1/chat/completions", json={"model": MODEL_ID, "messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"
    too_long = requests.post(f"{direct_url}/v1/chat/completions", json={
        "model": MODEL_ID, "messages": MESSAGES, "max_tokens": 100_000, "stream": True})
    assert too_long.status_code == 400 and too_long.headers["content-type"] == "application/json"
    assert "max_tokens" in too_long.json()["error"]["message"]
    assert requests.get(f"{direct_url}/health").json() == {"status": "ok"}


def test_disconnected_stream_is_aborted_and_frees_its_blocks(direct_url):
    assert_a_disconnect_frees_blocks(f"{direct_url}/v1", direct_stats)


def test_a_batch_reaches_the_replica_through_its_handle(direct):
    lines = [chat_line("a", "Tell me a joke", 8), chat_line("b", "What is Python?", 8)]
    upload = direct.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    batch = direct.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = finished(direct, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    results = read_jsonl(direct, batch.output_file_id)
    assert [r["custom_id"] for r in results] == ["a", "b"]
    assert all(r["response"]["status_code"] == 200 for r in results)


def test_direct_streaming_is_one_model_and_defaults_to_rays_switch(monkeypatch):
    one = {"model_loading_config": {"model_id": "m"}}
    two = {"model_loading_config": {"model_id": "n"}}
    with pytest.raises(ValueError, match="direct_streaming serves one model"):
        parse_app_config({"llm_configs": [one, two], "direct_streaming": True})
    monkeypatch.delenv(DIRECT_STREAMING_ENV, raising=False)
    assert parse_app_config({"llm_configs": [one]}).direct_streaming is False
    monkeypatch.setenv(DIRECT_STREAMING_ENV, "1")
    assert parse_app_config({"llm_configs": [one]}).direct_streaming is True
    assert parse_app_config({"llm_configs": [one], "direct_streaming": False}).direct_streaming is False
