"""Every body the served app returns, checked against OpenAI's published OpenAPI schema
(tests/deployments/api/openapi): chat, completions, models, files, batches, Responses with every stream event, input
items, and errors, whole and streamed, through the real app.

Where OpenAI's own API contradicts its schema, we follow the API, and the check says so in KNOWN_DEPARTURES."""

import json
from fnmatch import fnmatch

import pytest
import requests

from tests.conftest import MODEL_ID
from tests.deployments.api.openapi import violations
from tests.deployments.api.test_reasoning_and_tools import WEATHER_TOOL
from tests.deployments.batch.test_batches import finished, jsonl

MESSAGES = [{"role": "user", "content": "Say something"}]
# Where OpenAI's API sends null and its schema has no null, we send what the API sends: (schema, path) -> why.
# `*` stands for an index.
KNOWN_DEPARTURES = {
    ("CreateCompletionResponse", "choices/*/finish_reason"):
        "the spec has one schema for whole and streamed completions; OpenAI's stream chunks before the last "
        "carry finish_reason null",
    ("CreateCompletionResponse", "choices/*/logprobs/token_logprobs/0"):
        "with echo, the prompt's first token has no logprob: OpenAI (and vLLM) send null",
    ("CreateCompletionResponse", "choices/*/logprobs/top_logprobs/0"):
        "with echo, the prompt's first token has no top logprobs: OpenAI (and vLLM) send null",
    ("OpenAIFile", "expires_at"): "a file that never expires: the spec's own file examples send null (7 times)",
    ("OpenAIFile", "status_details"): "deprecated; the spec's own file examples send null",
    ("Response", "user"): "not given: the spec's own Response examples send null (28 times)",
    ("ResponseStreamEvent", "response/user"): "as Response's user, inside the response.* events",
    ("ResponseStreamEvent", "response/usage"): "a response still in progress has no usage: the spec's own "
                                               "streaming examples send usage null in response.created",
    **{("Batch", field): "not reached (yet): the spec's own batch examples send null for each of these"
       for field in ("errors", "output_file_id", "error_file_id", "in_progress_at", "finalizing_at", "completed_at",
                     "failed_at", "expired_at", "cancelling_at", "cancelled_at")},
}


LISTS = {"ListFilesResponse": "OpenAIFile", "ListBatchesResponse": "Batch"}  # a list's departures are its items'


def excused(schema: str, path: str) -> bool:
    if schema in LISTS and fnmatch(path, "data/*/*"):
        schema, path = LISTS[schema], path.split("/", 2)[2]
    return any(known == schema and fnmatch(path, pattern) for known, pattern in KNOWN_DEPARTURES)


def conforms(body: dict, schema: str) -> None:
    """No violation of OpenAI's schema but a null listed in KNOWN_DEPARTURES."""
    unexcused = [(path, message) for path, message, value in violations(body, schema)
                 if not (value is None and excused(schema, path))]
    assert not unexcused, (schema, unexcused, json.dumps(body)[:2000])


def post(server, path: str, **body) -> dict:
    r = requests.post(f"{server.base_url}/v1/{path}", json={"model": MODEL_ID, **body})
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, path: str, **body) -> list[dict]:
    r = requests.post(f"{server.base_url}/v1/{path}", json={"model": MODEL_ID, "stream": True, **body})
    assert r.status_code == 200, r.text
    payloads = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]" if path != "responses" else True
    return [json.loads(p) for p in payloads if p != "[DONE]"]


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2, "n": 2, "stop": ["zz"]},
                                   {"tools": [WEATHER_TOOL], "tool_choice": "required"}])
def test_chat_completions(server, extra):
    conforms(post(server, "chat/completions", messages=MESSAGES, max_tokens=4, **extra),
             "CreateChatCompletionResponse")
    chunks = sse(server, "chat/completions", messages=MESSAGES, max_tokens=4,
                 stream_options={"include_usage": True}, **extra)
    assert chunks[-1]["usage"] and len(chunks) > 2
    for chunk in chunks:
        conforms(chunk, "CreateChatCompletionStreamResponse")


@pytest.mark.parametrize("extra", [{}, {"logprobs": 2, "echo": True, "n": 2}])
def test_completions(server, extra):
    conforms(post(server, "completions", prompt="Once upon", max_tokens=4, **extra), "CreateCompletionResponse")
    chunks = sse(server, "completions", prompt="Once upon", max_tokens=4, **extra)
    for chunk in chunks:  # OpenAI streams completions as the same object, piece by piece
        conforms(chunk, "CreateCompletionResponse")


def test_models(server):
    listed = requests.get(f"{server.base_url}/v1/models").json()
    conforms(listed, "ListModelsResponse")
    conforms(requests.get(f"{server.base_url}/v1/models/{MODEL_ID}").json(), "Model")


def test_files_and_batches(server, client):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 2}}
    uploaded = requests.post(f"{server.base_url}/v1/files", data={"purpose": "batch"},
                             files={"file": ("in.jsonl", jsonl([line]))}).json()
    conforms(uploaded, "OpenAIFile")
    conforms(requests.get(f"{server.base_url}/v1/files/{uploaded['id']}").json(), "OpenAIFile")
    conforms(requests.get(f"{server.base_url}/v1/files?limit=2").json(), "ListFilesResponse")
    created = post(server, "batches", input_file_id=uploaded["id"], endpoint="/v1/chat/completions",
                   completion_window="24h")
    conforms(created, "Batch")
    finished(client, created["id"])
    done = requests.get(f"{server.base_url}/v1/batches/{created['id']}").json()
    assert done["status"] == "completed"
    conforms(done, "Batch")
    conforms(requests.get(f"{server.base_url}/v1/batches?limit=2").json(), "ListBatchesResponse")
    output = requests.get(f"{server.base_url}/v1/files/{done['output_file_id']}/content").text
    conforms(json.loads(output)["response"]["body"], "CreateChatCompletionResponse")
    conforms(requests.delete(f"{server.base_url}/v1/files/{uploaded['id']}").json(), "DeleteFileResponse")


@pytest.mark.parametrize("extra", [
    {}, {"tools": [{"type": "function", **WEATHER_TOOL["function"]}], "tool_choice": "required"},
    {"max_output_tokens": 2, "top_logprobs": 2, "include": ["message.output_text.logprobs"]}])
def test_responses_and_every_stream_event(server, extra):
    extra = {"input": "Say something", "max_output_tokens": 4, **extra}
    body = post(server, "responses", **extra)
    conforms(body, "Response")
    events = sse(server, "responses", **extra)
    assert {"response.created", "response.in_progress"} <= {e["type"] for e in events}
    for event in events:
        conforms(event, "ResponseStreamEvent")
    items = requests.get(f"{server.base_url}/v1/responses/{body['id']}/input_items").json()
    conforms(items, "ResponseItemList")


@pytest.mark.parametrize("method, path, body", [
    ("post", "chat/completions", {"model": "nope", "messages": MESSAGES}),
    ("post", "chat/completions", {"model": MODEL_ID, "messages": "x"}),
    ("get", "files/file-nope", None), ("get", "batches/batch_nope", None), ("post", "responses", {"model": MODEL_ID}),
])
def test_errors(server, method, path, body):
    r = requests.request(method, f"{server.base_url}/v1/{path}", json=body)
    assert 400 <= r.status_code < 500
    conforms(r.json(), "ErrorResponse")
