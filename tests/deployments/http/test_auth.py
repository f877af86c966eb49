"""API keys: 401 in OpenAI's shape without one; a key sees only its own files, batches, responses and conversations."""

import json
import time

import openai
import pytest
import requests
from ray.experimental import internal_kv

from deployments.http import published_keys
from deployments.http.auth import key_digest
from tests.conftest import MODEL_ID, another_app, app_args

KEYS = ["key-alice", "key-bob"]


@pytest.fixture(scope="module")
def secure(server, tmp_path_factory):
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('secure')}")
    args["api_key"] = KEYS
    with another_app(server, "secure", args) as url:
        yield url


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/generate"),
    ("GET", "/v1/files"), ("GET", "/v1/batches"), ("GET", "/v1/files/file-x/content"),
    ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"),
])
def test_routes_need_a_key(secure, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic key-alice"}):
        r = requests.request(method, f"{secure}{path}", headers=headers, json={})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(f"{secure}/health").status_code == 200


def test_the_app_publishes_its_keys_as_digests_with_their_bounds_for_serves_proxy(secure):
    """What Serve's proxy reads to hold a key's requests past its bounds before routing them
    (deployments/http/proxy/admission.py): each key's digest, never the key."""
    bounds = published_keys.read()
    assert {bounds[key_digest(key)] for key in KEYS} == {(128, 256)}
    assert not any(key in json.dumps(sorted(bounds)) for key in KEYS)
    # an entry its app's replicas stopped renewing (the app deleted) is not read; a live one sharing a key widens it
    for app_name, age, key, bound in (("gone", published_keys.EXPIRES_S + 1, "key-gone", 1),
                                      ("wide", 0, KEYS[0], 1000)):
        entry = {"digests": [key_digest(key)], "max_in_flight": bound, "max_waiting": bound,
                 "published_at": time.time() - age}
        internal_kv._internal_kv_put(app_name, json.dumps(entry), namespace=published_keys.NAMESPACE)
    try:
        bounds = published_keys.read()
    finally:
        for app_name in ("gone", "wide"):
            published_keys.publish(app_name, [], 0, 0)
    assert key_digest("key-gone") not in bounds
    assert bounds[key_digest(KEYS[0])] == (1000, 1000) and bounds[key_digest(KEYS[1])] == (128, 256)


def test_with_keys_the_docs_and_schema_are_off_and_without_they_are_on(secure, server):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert requests.get(f"{secure}{path}").status_code == 404
    assert requests.get(f"{server.base_url}/openapi.json").json()["paths"]["/v1/chat/completions"]


def test_a_key_sees_only_its_own_files_and_batches(secure):
    alice = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[0])
    bob = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[1])
    reply = alice.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.usage.completion_tokens == 2
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}}
    uploaded = alice.files.create(file=("a.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
    for call in (lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
                 lambda: bob.files.delete(uploaded.id),
                 lambda: bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert uploaded.id not in [f.id for f in bob.files.list()]
    assert uploaded.id in [f.id for f in alice.files.list()]
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert alice.batches.retrieve(batch.id).id == batch.id


def test_a_key_sees_only_its_own_responses(secure):
    alice = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[0])
    bob = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[1])
    response = alice.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2)
    for call in (lambda: bob.responses.retrieve(response.id), lambda: bob.responses.delete(response.id),
                 lambda: bob.responses.create(model=MODEL_ID, input="x", previous_response_id=response.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert alice.responses.retrieve(response.id).output_text == response.output_text


def test_a_key_sees_only_its_own_conversations(secure):
    alice = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[0])
    bob = openai.Client(base_url=f"{secure}/v1", api_key=KEYS[1])
    conversation = alice.conversations.create(items=[{"type": "message", "role": "user", "content": "secret"}])
    item = alice.conversations.items.list(conversation.id).data[0]
    for call in (lambda: bob.conversations.retrieve(conversation.id),
                 lambda: bob.conversations.items.list(conversation.id),
                 lambda: bob.conversations.items.retrieve(item.id, conversation_id=conversation.id),
                 lambda: bob.conversations.delete(conversation.id),
                 lambda: bob.responses.create(model=MODEL_ID, input="x", conversation=conversation.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert alice.conversations.retrieve(conversation.id).id == conversation.id
