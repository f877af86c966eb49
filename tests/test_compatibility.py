"""What other servers' clients send is accepted, and what they read is there: unknown fields ignored (and named
in a header), echoed assistant messages, custom roles, newer OpenAI fields, vLLM's structured-output names,
`reasoning_content: null` on every stream delta; `stream_options` without `stream` is a 400, as peers answer."""

import json
import re

import pytest
import requests

from tests.conftest import MODEL_ID

HI = [{"role": "user", "content": "hi"}]


def test_unknown_fields_are_ignored_and_named_in_a_header(server):
    r = requests.post(f"{server.base_url}/v1/completions",
                      json={"prompt": "hi", "max_tokens": 2, "temperatur": 0.5, "best_effort": {"x": 1}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert r.headers["x-ignored-fields"] == "best_effort,temperatur"
    assert "x-ignored-fields" not in requests.post(f"{server.base_url}/v1/completions",
                                                   json={"prompt": "hi", "max_tokens": 1}).headers


def test_a_multi_turn_conversation_echoes_the_sdks_message_back(client):
    messages = list(HI)
    for turn in range(2):
        reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4)
        messages.append(reply.choices[0].message.model_dump())  # refusal, annotations, audio, function_call, ...
        messages.append({"role": "user", "content": f"and turn {turn}?"})
    assert set(messages[1]) >= {"refusal", "annotations", "audio", "function_call", "reasoning_content"}


def test_newer_openai_fields_and_custom_roles_are_accepted(client):
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "narrator", "content": "Once"}, *HI], max_tokens=3,
        extra_body={"reasoning_effort": "low", "prompt_cache_key": "k", "safety_identifier": "s", "verbosity": "low",
                    "modalities": ["text"], "prediction": None, "audio": None,
                    "functions": [{"name": "f", "parameters": {"type": "object"}}]})
    assert reply.usage.completion_tokens >= 1


def test_stream_options_without_stream_is_400(server):
    r = requests.post(f"{server.base_url}/v1/chat/completions",
                      json={"messages": HI, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] is None or "stream_options" in r.text


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
    ({"structured_outputs": {"choice": ["left", "right \"quoted\""]}}, lambda t: t in ("left", 'right "quoted"')),
    ({"guided_regex": "[0-9]{3}"}, lambda text: re.fullmatch("[0-9]{3}", text)),
    ({"structured_outputs": {"regex": "(ab)+"}}, lambda text: re.fullmatch("(ab)+", text)),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     lambda text: isinstance(json.loads(text)["n"], int)),
    ({"structured_outputs": {"json": {"type": "array", "items": {"type": "boolean"}, "minItems": 1}}},
     lambda text: all(isinstance(x, bool) for x in json.loads(text)) and json.loads(text)),
    ({"guided_grammar": 'root ::= "A" | "B"'}, lambda text: text in ("A", "B")),
])
def test_vllms_structured_output_names_constrain_the_output(client, extra, check):
    reply = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=40, temperature=1.0, seed=3,
                                           extra_body=extra)
    assert check(reply.choices[0].message.content), reply.choices[0].message.content


def test_two_constraints_at_once_are_400(server):
    r = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "regex": "a", "guided_choice": ["b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_choice"


def test_every_stream_delta_has_reasoning_content(client):
    stream = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=5, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert len(deltas) >= 3 and all(d.reasoning_content is None for d in deltas)  # an AttributeError if absent
