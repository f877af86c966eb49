"""The HTTP layer on its own: the FastAPI app built in-process around a scripted `ModelClient`, no Ray, no engine.

What is checked here is the edge's own logic (status codes, SSE framing, in-band errors, Responses events
over typed chunks, auth, the ignored-fields header); tests/deployments/serving/test_serving.py proves the real
path end to end.
"""

import json

import pytest
from fastapi.testclient import TestClient

from deployments.app_config import parse_app_config
from deployments.batch.api import BatchAPI
from deployments.batch.files import FileLimits
from deployments.batch.job import BatchLimits
from deployments.errors import OpenAIError, StreamError
from deployments.http.app import build_app
from deployments.http.auth import ApiKeys
from deployments.http.body import BodyParser
from deployments.http.conversations.handler import ConversationsAPI
from deployments.http.conversations.store import ConversationStore
from deployments.http.front import OpenAIFront
from deployments.http.models import ModelRegistry
from deployments.http.responses.handler import ResponsesAPI
from deployments.http.responses.store import ResponseStore
from deployments.storage import open_store
from deployments.storage.usage import Quota

MODEL = "tiny"


def chunk(content: str | None = None, finish: str | None = None, **delta) -> dict:
    if content is not None:
        delta["content"] = content
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


class ScriptedModel:
    """A `ModelClient` whose streams yield the items it is given (chunks, then maybe a StreamError), or
    raise `fail_first` before any."""

    def __init__(self, items: list, fail_first: OpenAIError | None = None):
        self.items = items
        self.fail_first = fail_first
        self.requests = []

    async def chat(self, req, request_id=None, priority=0, owner=None) -> dict:
        self.requests.append(req)
        if self.fail_first:
            raise self.fail_first
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                          "prompt_tokens_details": {"cached_tokens": 0}}}

    async def chat_stream(self, req, owner=None):
        self.requests.append(req)
        if self.fail_first:
            raise self.fail_first
        for item in self.items:
            yield item

    async def healthy(self) -> bool:
        return True

    async def max_model_len(self) -> int:
        return 64

    async def quantization(self) -> str | None:
        return None

    async def architecture(self) -> str:
        return "ScriptedForCausalLM"


def serve_in_process(model: ScriptedModel, tmp_path, api_key: str | list[str] | None = None, **app_args
                     ) -> TestClient:
    storage = f"file://{tmp_path}"
    config = parse_app_config({"llm_configs": [{"model_loading_config": {"model_id": MODEL,
                                                                         "model_source": str(tmp_path)}}],
                               "storage_uri": storage, "api_key": api_key, **app_args})
    models = ModelRegistry(config, {MODEL: model})
    quota = Quota(config.max_files_per_key, config.max_file_bytes_per_key)
    batches = BatchAPI(storage, "test", {}, FileLimits(1 << 20, 10, quota), BatchLimits(1, 1 << 10, 10))
    conversations = ConversationsAPI(ConversationStore(open_store(storage)))
    front = OpenAIFront(config, ApiKeys(config.api_keys), models, BodyParser(models, config.max_request_bytes),
                        batches, ResponsesAPI(ResponseStore(open_store(storage)), batches, config.max_image_bytes,
                                              conversations, config.max_requests_per_key), conversations)
    return TestClient(build_app(front))


def sse_payloads(text: str) -> list:
    return [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}


def test_a_stream_is_framed_at_the_edge_and_ends_with_done(tmp_path):
    app = serve_in_process(ScriptedModel([chunk("a"), chunk("é"), chunk(finish="stop")]), tmp_path)
    reply = app.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(reply.text)
    assert payloads[-1] == "[DONE]"
    assert [json.loads(p)["choices"][0]["delta"].get("content") for p in payloads[:-1]] == ["a", "é", None]
    assert "é" in reply.text  # UTF-8 on the wire, not \u escapes


def test_a_client_that_serve_lets_go_mid_stream_is_a_disconnect_not_a_failure(tmp_path):
    """Behind Serve's proxy, `receive` raises TaskCancelledError once the proxy dropped a request whose client
    left. The app takes it as a disconnect: the stream ends (its generator closed) and the call returns, where
    the error would otherwise reach Serve, which logs "Request failed" with a traceback and counts an error."""
    import asyncio

    from ray.exceptions import TaskCancelledError

    class EndlessModel(ScriptedModel):
        closed = False

        async def chat_stream(self, req, owner=None):
            try:
                while True:
                    yield chunk("a")
                    await asyncio.sleep(0)
            finally:
                EndlessModel.closed = True

    app = serve_in_process(EndlessModel([]), tmp_path).app
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent = []

    async def scenario():
        streaming = asyncio.Event()
        requests = [{"type": "http.request", "body": json.dumps({**CHAT, "stream": True}).encode(),
                     "more_body": False}]

        async def receive():
            if requests:
                return requests.pop()
            await streaming.wait()  # the client leaves once chunks are flowing
            raise TaskCancelledError()

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and len(sent) > 3:
                streaming.set()

        await asyncio.wait_for(app(scope, receive, send), timeout=30)

    asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert len(sent) > 3 and EndlessModel.closed


def test_an_error_before_the_first_chunk_keeps_its_status(tmp_path):
    app = serve_in_process(ScriptedModel([], fail_first=OpenAIError(400, "bad value", "temperature")), tmp_path)
    reply = app.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 400
    assert reply.json() == {"error": {"message": "bad value", "type": "invalid_request_error",
                                      "param": "temperature", "code": None}}


def test_an_error_after_the_first_chunk_is_an_in_band_event_then_done(tmp_path):
    app = serve_in_process(ScriptedModel([chunk("a"), StreamError(503, "replica lost")]), tmp_path)
    reply = app.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 200
    payloads = sse_payloads(reply.text)
    assert payloads[-1] == "[DONE]" and len(payloads) == 3
    assert json.loads(payloads[1]) == {"error": {"message": "replica lost", "type": "service_unavailable_error",
                                                 "param": None, "code": None}}


def test_responses_stream_is_built_from_chunks_and_fails_on_a_stream_error(tmp_path):
    model = ScriptedModel([chunk("hel", role="assistant"), chunk("lo"), StreamError(500, "the engine failed")])
    app = serve_in_process(model, tmp_path)
    reply = app.post("/v1/responses", json={"model": MODEL, "input": "x", "stream": True})
    assert reply.status_code == 200
    blocks = [b for b in reply.text.split("\n\n") if b]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "error", "response.failed"]
    events = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["hel", "lo"]
    assert events[-2]["message"] == "the engine failed"
    assert events[-1]["response"]["status"] == "failed"
    assert "[DONE]" not in reply.text


def test_responses_error_before_the_first_chunk_keeps_its_status(tmp_path):
    app = serve_in_process(ScriptedModel([], fail_first=OpenAIError(400, "too long", "messages")), tmp_path)
    reply = app.post("/v1/responses", json={"model": MODEL, "input": "x", "stream": True})
    assert reply.status_code == 400 and reply.json()["error"]["message"] == "too long"


def test_ignored_fields_header_unknown_model_and_auth(tmp_path):
    model = ScriptedModel([])
    app = serve_in_process(model, tmp_path, api_key="sk-1")
    assert app.post("/v1/chat/completions", json=CHAT).status_code == 401
    keyed = {"Authorization": "Bearer sk-1"}
    reply = app.post("/v1/chat/completions", json={**CHAT, "surprise": 1}, headers=keyed)
    assert reply.status_code == 200 and reply.headers["x-ignored-fields"] == "surprise"
    assert reply.json()["choices"][0]["message"]["content"] == "hi"
    missing = app.post("/v1/chat/completions", json={**CHAT, "model": "other"}, headers=keyed)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert app.get("/v1/models", headers=keyed).json()["data"][0]["max_model_len"] == 64
    assert len(model.requests) == 1  # refused requests never reached the model


@pytest.mark.parametrize("body, status", [("{", 400), ("[1]", 400), ('{"messages": 5}', 400)])
def test_bad_bodies_never_reach_the_model(tmp_path, body, status):
    model = ScriptedModel([])
    app = serve_in_process(model, tmp_path)
    reply = app.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status and set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert model.requests == []


BAD_IDS = ["%00", "a" * 300, "..%2F..%2Fetc%2Fpasswd", "file-%2F..", "%E2%80%AE", "resp_" + "0" * 31 + "%00"]
ID_ROUTES = [("get", "/v1/files/{}"), ("get", "/v1/files/{}/content"), ("delete", "/v1/files/{}"),
             ("get", "/v1/batches/{}"), ("post", "/v1/batches/{}/cancel"), ("get", "/v1/responses/{}"),
             ("delete", "/v1/responses/{}")]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_every_id_is_checked_before_storage(tmp_path, bad_id):
    """Path ids that cannot be ids are not found; body fields that cannot be ids are bad values; never a 500."""
    app = serve_in_process(ScriptedModel([]), tmp_path)
    for method, route in ID_ROUTES:
        reply = getattr(app, method)(route.format(bad_id))
        assert reply.status_code == 404, (route, reply.text)
        assert reply.json()["error"]["type"] == "not_found_error"
    raw = bad_id.replace("%00", "\x00").replace("%2F", "/").replace("%E2%80%AE", "\u202e")
    batch = app.post("/v1/batches", json={"input_file_id": raw, "endpoint": "/v1/chat/completions",
                                          "completion_window": "24h"})
    assert batch.status_code == 400 and batch.json()["error"]["param"] == "input_file_id", batch.text
    if not raw.startswith("resp_"):
        return
    previous = app.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": raw})
    assert previous.status_code == 400 and previous.json()["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize("field, value", [
    ("metadata", {f"k{i}": "v" for i in range(17)}),
    ("metadata", {"k" * 65: "v"}),
    ("metadata", {"k": "v" * 513}),
    ("input_file_id", "s3://bucket/" + "k" * 1020),
    ("completion_window", "9" * 30 + "d"),
])
def test_batch_bodies_within_openai_limits(tmp_path, field, value):
    app = serve_in_process(ScriptedModel([]), tmp_path)
    body = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h",
            field: value}
    reply = app.post("/v1/batches", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] in (field, f"metadata.{next(iter(value))}" if field == "metadata" else field)


def test_unauthenticated_upload_is_401_whatever_its_content_type(tmp_path):
    app = serve_in_process(ScriptedModel([]), tmp_path, api_key="sk-1")
    assert app.post("/v1/files", content=b"x", headers={"content-type": "text/plain"}).status_code == 401


@pytest.mark.parametrize("stream, status", [(False, 400), (True, 200)])
def test_a_reply_body_too_large_to_build_whole_must_be_streamed(tmp_path, stream, status):
    """n 64 x 744 tokens x 21 logprobs is 999,936 entries: a 72 MB body whole, fine as a stream."""
    app = serve_in_process(ScriptedModel([chunk("a")]), tmp_path)
    reply = app.post("/v1/chat/completions", json={**CHAT, "n": 64, "max_tokens": 744, "logprobs": True,
                                                   "top_logprobs": 20, "stream": stream})
    assert reply.status_code == status, reply.text
    if not stream:
        assert "stream it" in reply.json()["error"]["message"]


def test_a_chat_pins_its_prefix_within_bounds(tmp_path):
    """`pin_prefix_tokens` and `pin_ttl_s` reach the model; a TTL past an hour, or a negative count, is a 400."""
    model = ScriptedModel([])
    client = serve_in_process(model, tmp_path)
    assert client.post("/v1/chat/completions", json={**CHAT, "pin_prefix_tokens": 64, "pin_ttl_s": 60}).is_success
    assert (model.requests[0].pin_prefix_tokens, model.requests[0].pin_ttl_s) == (64, 60)
    for field, value in (("pin_ttl_s", 3601), ("pin_ttl_s", 0), ("pin_prefix_tokens", -1)):
        r = client.post("/v1/chat/completions", json={**CHAT, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


@pytest.mark.parametrize("by_key", [True, False])
def test_each_keys_requests_carry_its_cache_salt(tmp_path, by_key):
    """With API keys, chat, Anthropic Messages and Responses requests reach the model salted by their key (the
    request's own salt after it); the operator may turn that off, leaving each request's own salt."""
    model = ScriptedModel([])
    client = serve_in_process(model, tmp_path, api_key=["sk-a", "sk-b"], cache_salt_by_key=by_key)
    for key, salt in (("sk-a", None), ("sk-b", None), ("sk-a", "team-1")):
        headers = {"Authorization": f"Bearer {key}"}
        client.post("/v1/chat/completions", json={**CHAT, **({"cache_salt": salt} if salt else {})}, headers=headers)
    client.post("/v1/messages", headers={"x-api-key": "sk-b"}, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "cache_salt": "s"})
    client.post("/v1/responses", headers={"Authorization": "Bearer sk-a"}, json={"model": MODEL, "input": "x"})
    salts = [r.cache_salt for r in model.requests]
    keys = ApiKeys(["sk-a", "sk-b"])
    owners = {key: keys.known_owner({"authorization": f"Bearer {key}"}) for key in ("sk-a", "sk-b")}
    if by_key:
        assert salts == [f"key {owners['sk-a']}", f"key {owners['sk-b']}", f"key {owners['sk-a']}|team-1",
                         f"key {owners['sk-b']}|s", f"key {owners['sk-a']}"]
    else:
        assert salts == [None, None, "team-1", "s", None]
