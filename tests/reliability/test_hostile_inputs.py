"""A hostile client's sweep: every sampling field at its extremes (0, negative, huge, int64 edges, out of the
vocabulary, the wrong type) on chat, completions and /generate, and oversized templates, prompts, stop lists
and grammars. Each answer must be a 2xx, or a 4xx in OpenAI's shape, within ANSWER_BOUND_S; a normal request
sent while it runs and one sent right after must each succeed within NORMAL_BOUND_S (two cores). vLLM's
structured-output names (guided_*, structured_outputs), SGLang's stop_regex and /v1/responses are swept at
their extremes too. The newer routes' fields at their extremes (/v1/embeddings, /score, /rerank and /classify on
an embedding model, /tokenize, Anthropic's /v1/messages) must each be a 4xx in the route's own error shape
(Anthropic's on /v1/messages), a normal request of that app beside them as fast.

Run with the reliability suite: `python -m pytest -m reliability -s`. RELIABILITY_SWEEP_FIELDS limits how
many field sweeps run (all by default); `.ci/run` runs them all. Figures are printed as one JSON line.
"""

import concurrent.futures
import json
import os
import time

import pytest
import requests

pytestmark = pytest.mark.reliability
ANSWER_BOUND_S = 30.0
NORMAL_BOUND_S = 1.0
INT64 = 2**63
EXTREMES = [0, -1, 1, INT64 - 1, INT64, -INT64 - 1, 2**64, 10**40, 1e308, -1e308, "7", None, [], {}]

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1}
COMPLETION = {"prompt": "hi", "max_tokens": 4, "temperature": 1}
FIELDS = ["n", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "seed", "stop_token_ids", "logit_bias", "stop"]
GENERATE_FIELDS = ["max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "n", "sampling_seed",
                   "stop_token_ids", "stop"]
VOCAB_EDGES = [512, 10**6, -1, INT64]  # the test model's vocabulary is 512 tokens


def _values(field: str) -> list:
    """A field's extremes, in the shape the field takes (a list of ids, a map of id -> bias, strings)."""
    if field == "stop_token_ids":
        return [[v] for v in VOCAB_EDGES] + [[5] * 100_000, "x", [None]]
    if field == "logit_bias":
        return [{str(v): 10} for v in VOCAB_EDGES] + [{"5": 1e308}, {"9" * 5000: 1}, {"5": "x"}, []]
    if field == "stop":
        return [["a"] * 100_000, "x" * 1_000_000, [""], [None], 5]
    return EXTREMES


def _cases():
    for field in FIELDS:
        for value in _values(field):
            for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
                yield field, path, {**base, field: value}
    for field in GENERATE_FIELDS:
        for value in _values(field):
            yield field, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, field: value}}
    oversized = [
        ("template", "/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"chat_template": "{{ 'x' * 10**9 }}"}}),
        ("prompt", "/v1/completions", {**COMPLETION, "prompt": "word " * 2_000_000}),
        ("messages", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi"}] * 100_000}),
        ("prompts x n", "/v1/completions", {**COMPLETION, "prompt": ["hi"] * 2000, "n": 128}),
        ("regex", "/v1/completions", {**COMPLETION, "regex": "(a|b)*" * 20_000}),
        ("json schema", "/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"enum": [f"v{i}" for i in range(100_000)]}}}}),
        ("deep schema", "/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": _nested(60)}}}),
        ("logprob volume", "/v1/chat/completions", {**CHAT, "n": 64, "max_tokens": 1500, "min_tokens": 1500,
                                                    "logprobs": True, "top_logprobs": 20}),
        # vLLM's structured-output names
        ("guided_choice", "/v1/completions", {**COMPLETION, "guided_choice": [f"c{i}" for i in range(100_000)]}),
        ("guided_choice empty", "/v1/completions", {**COMPLETION, "guided_choice": []}),
        ("guided_regex", "/v1/chat/completions", {**CHAT, "guided_regex": "(a|b)*" * 20_000}),
        ("guided_grammar", "/v1/completions", {**COMPLETION, "guided_grammar": "root ::= root"}),
        ("guided_json", "/v1/chat/completions", {**CHAT, "guided_json": _nested(60)}),
        ("structured_outputs", "/v1/completions", {**COMPLETION, "structured_outputs": {"choice": "x", "json": 5}}),
        ("stream_options without stream", "/v1/completions", {**COMPLETION, "stream_options": {"x": 1}}),
        ("custom role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "r" * 100_000, "content": "hi"}]}),
        # SGLang's stop_regex: patterns that backtrack exponentially in Python's re, on a long output
        ("stop_regex", "/v1/completions", {**COMPLETION, "max_tokens": 400, "ignore_eos": True,
                                           "stop_regex": ["(a+)+$", "(x|x)*y", "(.*)*z", "(a|aa)+$"]}),
        ("stop_regex list", "/v1/completions", {**COMPLETION, "stop_regex": ["a"] * 100_000}),
        ("prompt_logprobs", "/v1/completions", {**COMPLETION, "prompt": "word " * 400, "prompt_logprobs": 20}),
        # the Responses API
        ("responses items", "/v1/responses", {"input": [{"role": "user", "content": "hi"}] * 100_000}),
        ("responses previous id", "/v1/responses", {"input": "hi", "previous_response_id": "../" * 10_000}),
        ("responses tools", "/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}] * 10_000}),
        # round 2, at the caps: ids before storage, stop strings bounded in length and work, reply bodies
        # bounded in bytes, batch metadata within OpenAI's limits
        ("batch NUL input id", "/v1/batches", {"input_file_id": "\u0000", "endpoint": "/v1/chat/completions"}),
        ("batch long input id", "/v1/batches", {"input_file_id": "f" * 300, "endpoint": "/v1/chat/completions"}),
        ("batch metadata", "/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                                           "metadata": {f"k{i}": "v" * 600_000 for i in range(16)}}),
        ("batch window", "/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                                         "completion_window": "9" * 40 + "d"}),
        ("long stops", "/generate", {"text": "hi", "sampling_params": {
            "stop": ["ab" * 8_000] * 64, "n": 8, "max_new_tokens": 2000, "ignore_eos": True}}),
        ("stops at the cap", "/v1/chat/completions", {**CHAT, "stop": ["a" * 1024] * 4, "max_tokens": 300,
                                                      "ignore_eos": True}),
        ("reply amplification", "/v1/chat/completions", {**CHAT, "n": 64, "max_tokens": 744, "min_tokens": 744,
                                                         "logprobs": True, "top_logprobs": 20}),
    ]
    for name, path, body in oversized:
        yield f"oversized {name}", path, body


def _nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


MESSAGES = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"name": "f", "input_schema": {"type": "object"}}
NEWER_ROUTES_EXTREMES = [
    *(("embeddings input", {"input": value}) for value in (
        ["hi"] * 2048, [[1]] * 5000, [1] * 2048, [[1] * 100_000], [[INT64]], [[2**64]], [10**40], [-1], [[-INT64 - 1]],
        [5, "hi"], [[]], [""], [], None, {}, 1e308, "word " * 2_000_000)),
    *(("embeddings dimensions", {"input": "hi", "dimensions": value})
      for value in (-1, 0, -INT64 - 1, 65, 10**6, INT64, 2**64, 1e308, "7x", [], {})),
    *(("embeddings encoding_format", {"input": "hi", "encoding_format": value})
      for value in ("junk", "FLOAT", "base64 ", "", 5, None, [], "x" * 1_000_000)),
    *(("tokenize", body) for body in (
        {"messages": [{"role": "user", "content": "hi"}] * 100_000},
        {"messages": [{"role": "user", "content": "word " * 2_000_000}]},
        {"prompt": "word " * 2_000_000},
        {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"},
        {"messages": []}, {})),
    *(("messages max_tokens", {**MESSAGES, "max_tokens": value})
      for value in (0, -1, 513, 10**6, INT64, 2**64, 10**40, 1e308, "x", None)),
    *(("messages top_k", {**MESSAGES, "top_k": value}) for value in (-1, 0, -INT64 - 1, -(10**40), "x")),
    *(("messages stop_sequences", {**MESSAGES, "stop_sequences": value})
      for value in (["a"] * 100_000, ["x" * 1_000_000], ["ab" * 8_000] * 4, [None], "x", 5)),
    *(("messages thinking", {**MESSAGES, "max_tokens": 100, "thinking": value}) for value in (
        {"type": "enabled", "budget_tokens": -1}, {"type": "enabled", "budget_tokens": 0},
        {"type": "enabled", "budget_tokens": 100}, {"type": "enabled", "budget_tokens": INT64},
        {"type": "enabled", "budget_tokens": 2**64}, {"type": "enabled", "budget_tokens": "x"},
        {"type": "enabled", "budget_tokens": []}, {"type": "junk"}, {"type": "x" * 1_000_000}, "enabled", [])),
    *(("messages tools", {**MESSAGES, "tools": value}) for value in (
        [{"name": ""}], [{**TOOL, "name": "x" * 100_000}], [{**TOOL, "input_schema": 5}], [5], "x", {},
        [TOOL] * 100_000, [{**TOOL, "input_schema": _nested(200)}])),
    *(("messages tool_choice", {**MESSAGES, "tools": [TOOL], "tool_choice": value}) for value in (
        {"type": "tool"}, {"type": "tool", "name": "nope"}, {"type": "junk"}, "any", [])),
    ("messages", {**MESSAGES, "messages": [{"role": "user", "content": "hi"}] * 100_000}),
    ("messages", {**MESSAGES, "messages": [{"role": "user", "content": "word " * 2_000_000}]}),
    *(("score text_1", {"text_1": value, "text_2": "b"}) for value in (
        ["a"] * 2048, [], [""], None, 5, [5], {}, ["a", "b"], "word " * 2_000_000, ["word " * 300])),
    *(("score text_2", {"text_1": ["a", "b"], "text_2": value}) for value in (["c"] * 3, [], "c", None, [[1]])),
    *(("score max_tokens_per_doc", {"text_1": "a", "text_2": "b", "max_tokens_per_doc": value})
      for value in (-1, -INT64 - 1, 1e308, "x", [])),
    *(("rerank documents", {"query": "q", "documents": value}) for value in (
        [], ["d"] * 2048, [5], None, "d", [{"text": 5}], [{}], [""], ["word " * 2_000_000])),
    *(("rerank query", {"query": value, "documents": ["d"]}) for value in (None, 5, [], "", "word " * 300)),
    *(("rerank top_n", {"query": "q", "documents": ["d"], "top_n": value}) for value in (-1, -INT64 - 1, "x", 1.5)),
    *(("classify", body) for body in ({"input": "hi"}, {"input": []}, {"input": [[70_000]]}, {})),
]
NEWER_ROUTES = {"embeddings": "/v1/embeddings", "tokenize": "/tokenize", "messages": "/v1/messages",
                "score": "/score", "rerank": "/v2/rerank", "classify": "/classify"}
POOLING_ROUTES = ("embeddings", "score", "rerank", "classify")  # served by the embedding app


def _completion(base_url: str) -> None:
    r = requests.post(f"{base_url}/v1/completions", json={"prompt": "hello", "max_tokens": 2, "temperature": 0},
                      timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def _embedding(base_url: str) -> None:
    r = requests.post(f"{base_url}/v1/embeddings", json={"input": "hello"}, timeout=30)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 64, r.text


def _timed(normal, base_url: str) -> float:
    start = time.monotonic()
    normal(base_url)
    return time.monotonic() - start


def _openai_shaped(r: requests.Response) -> bool:
    return set(r.json().get("error", {})) == {"message", "type", "param", "code"}


def _anthropic_shaped(r: requests.Response) -> bool:
    body = r.json()
    return body.get("type") == "error" and set(body.get("error", {})) == {"type", "message"}


def _sweep(name: str, cases, must_refuse: bool) -> None:
    """Send each (label, base URL, path, body, the normal request of that app) with its normal request beside it
    and after it; every answer in its route's shape (a 2xx too, unless `must_refuse`) within the bounds."""
    statuses, slowest_answer, slowest_normal, findings = {}, 0.0, 0.0, []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for label, base_url, path, body, normal in cases:
            start = time.monotonic()
            hostile = pool.submit(requests.post, f"{base_url}{path}", json=body, timeout=ANSWER_BOUND_S * 4)
            during = _timed(normal, base_url)
            r = hostile.result()
            answer_s = time.monotonic() - start
            after = _timed(normal, base_url)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            slowest_answer, slowest_normal = max(slowest_answer, answer_s), max(slowest_normal, during, after)
            shaped = _anthropic_shaped if path == "/v1/messages" else _openai_shaped
            answered = (r.status_code < 300 and not must_refuse) or (400 <= r.status_code < 500 and shaped(r))
            if not (answered and answer_s <= ANSWER_BOUND_S and max(during, after) <= NORMAL_BOUND_S):
                findings.append((label, path, r.status_code, r.text[:160], round(answer_s, 2), round(during, 2),
                                 round(after, 2)))
    print(json.dumps({"reliability": name, "requests": len(cases), "statuses": statuses,
                      "slowest_answer_s": round(slowest_answer, 2), "slowest_normal_s": round(slowest_normal, 2),
                      "findings": len(findings)}))
    assert findings == [], findings


def test_every_field_at_its_extremes_answers_in_shape_and_never_slows_a_normal_request(server):
    limit = int(os.environ.get("RELIABILITY_SWEEP_FIELDS", 10**6))
    fields = set((FIELDS + GENERATE_FIELDS)[:limit])
    _sweep("hostile_sweep", [(field, server.base_url, path, body, _completion) for field, path, body in _cases()
                             if field in fields or field.startswith("oversized")], must_refuse=False)


def test_the_newer_routes_refuse_every_extreme_in_their_own_shape(server, embedder):
    embed_url = str(embedder.base_url).removesuffix("/").removesuffix("/v1")
    cases = []
    for label, body in NEWER_ROUTES_EXTREMES:
        route = label.split()[0]
        base_url, normal = (embed_url, _embedding) if route in POOLING_ROUTES else (server.base_url, _completion)
        cases.append((label, base_url, NEWER_ROUTES[route], body, normal))
    _sweep("newer_routes_sweep", cases, must_refuse=True)
