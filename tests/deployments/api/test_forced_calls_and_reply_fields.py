"""What other people's clients found (issue 27): nested tool schemas under a forced call, a forced call beside
a text format, Responses' creation time and cut items, OpenAI's exact chat shapes, malformed response ids,
vLLM's prompt_logprobs keys. Each through the served app."""

import json

import jsonschema
import openai
import pytest
import requests

from tests.conftest import MODEL_ID
from tests.deployments.api.test_reasoning_and_tools import forced
from tests.deployments.api.test_responses import create, stream

# what pydantic makes of a nested model: the parameters refer to their own $defs
NESTED = {"$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                              "required": ["x", "y"]}},
          "type": "object", "properties": {"at": {"$ref": "#/$defs/Point"}}, "required": ["at"]}
# a second tool whose $defs use the same name for something else
CLASHING = {"$defs": {"Point": {"type": "string", "enum": ["north", "south"]}},
            "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"]}


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_forced_calls_resolve_each_tools_own_defs(client):
    tools = [tool("place", NESTED), tool("go", CLASHING)]
    schemas = {"place": NESTED, "go": CLASHING}
    messages = [{"role": "user", "content": "x"}]
    for seed in range(3):
        for choice in ("required", {"type": "function", "function": {"name": "go"}}):
            r = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools, tool_choice=choice,
                                               temperature=1.0, seed=seed, max_tokens=120)
            (call,) = r.choices[0].message.tool_calls
            assert choice == "required" or call.function.name == "go"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_responses_forced_call_with_nested_defs_and_a_text_format(server):
    """instructor's RESPONSES_TOOLS mode: a named tool with $defs and a json_schema text format, together."""
    response = create(server, input="x", tools=[{"type": "function", "name": "place", "parameters": NESTED}],
                      tool_choice={"type": "function", "name": "place"}, max_output_tokens=150, temperature=0,
                      text={"format": {"type": "json_schema", "name": "Out", "schema": {"type": "object"}}})
    (call,) = [item for item in response["output"] if item["type"] == "function_call"]
    jsonschema.validate(json.loads(call["arguments"]), NESTED)


def test_chat_forced_call_with_response_format_is_the_call(client):
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "x"}], tools=[tool("place", NESTED)],
        tool_choice={"type": "function", "function": {"name": "place"}}, max_tokens=150, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "Out", "schema": {"type": "object"}}})
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), NESTED)


def test_response_created_at_is_stamped_once(server):
    events = stream(server, input="x", max_output_tokens=4)
    stamps = {e["response"]["created_at"] for e in events if "response" in e}
    assert len(stamps) == 1
    final = events[-1]["response"]
    stored = requests.get(f"{server.base_url}/v1/responses/{final['id']}").json()
    assert stored["created_at"] == final["created_at"]


def test_the_item_a_token_limit_cut_is_incomplete(server):
    response = create(server, input="x", max_output_tokens=3, ignore_eos=True)
    assert response["status"] == "incomplete"
    assert response["output"][-1]["status"] == "incomplete"
    events = stream(server, input="x", max_output_tokens=3, ignore_eos=True)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[-1]["status"] == "incomplete"
    assert events[-1]["response"]["output"][-1]["status"] == "incomplete"
    full = create(server, input="x", max_output_tokens=50, **forced("hello"))
    assert full["status"] == "completed" and all(item["status"] == "completed" for item in full["output"])


def test_chat_message_and_logprobs_carry_refusal_and_omit_absent_tool_calls(server):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "logprobs": True}
    choice = requests.post(f"{server.base_url}/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["refusal"] is None and "tool_calls" not in choice["message"]
    assert choice["logprobs"]["refusal"] is None and len(choice["logprobs"]["content"]) == 3


def test_a_previous_response_id_that_is_no_id_is_400(server):
    r = requests.post(f"{server.base_url}/v1/responses", json={"model": MODEL_ID, "input": "x",
                                                                "previous_response_id": "bad"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    well_formed = requests.post(f"{server.base_url}/v1/responses", json={
        "model": MODEL_ID, "input": "x", "previous_response_id": "resp_" + "0" * 32})
    assert well_formed.status_code == 404


def test_prompt_logprobs_key_is_always_there(client):
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert chat.prompt_logprobs is None
    completion = client.completions.create(model=MODEL_ID, prompt="x", max_tokens=1)
    assert completion.choices[0].prompt_logprobs is None
    asked = client.completions.create(model=MODEL_ID, prompt="a b", max_tokens=1, extra_body={"prompt_logprobs": 1})
    assert asked.choices[0].prompt_logprobs[0] is None and len(asked.choices[0].prompt_logprobs) > 1


def test_prompt_logprobs_temperature_is_refused_clearly(client):
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs_temperature"):
        client.completions.create(model=MODEL_ID, prompt="x", max_tokens=1,
                                  extra_body={"prompt_logprobs": 1, "prompt_logprobs_temperature": 0.5})
