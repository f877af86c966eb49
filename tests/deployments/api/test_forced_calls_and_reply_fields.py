"""What other people's clients found (issue 27): nested tool schemas under a forced call, a forced call beside
a text format, Responses' creation time and cut items, OpenAI's exact chat shapes, malformed response ids,
vLLM's prompt_logprobs keys. Each through the served app."""

import json

import jsonschema
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


def test_a_forced_call_cut_by_max_tokens_is_a_call_never_text(server, client):
    """Cut inside the call's arguments: chat returns the call so far in tool_calls with finish_reason length
    (streamed the same); Anthropic's Messages a tool_use block with stop_reason max_tokens; no raw call JSON in
    any text."""
    import anthropic

    weather = {"type": "object", "properties": {"city": {"type": "string", "minLength": 200}}, "required": ["city"]}
    messages = [{"role": "user", "content": "x"}]
    # 60 tokens: past the call's name (35 characters in), short of a city of 200
    forced = {"model": MODEL_ID, "messages": messages, "tools": [tool("get_weather", weather)],
              "tool_choice": "required", "max_tokens": 60, "temperature": 0}
    r = client.chat.completions.create(**forced)
    choice = r.choices[0]
    (call,) = choice.message.tool_calls
    assert (choice.finish_reason, choice.message.content, call.function.name) == ("length", None, "get_weather")
    assert call.function.arguments.startswith("{") and '"name"' not in call.function.arguments
    chunks = list(client.chat.completions.create(**forced, stream=True))
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [("get_weather", call.function.arguments)]
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="None")
    message = claude.messages.create(
        model=MODEL_ID, max_tokens=60, messages=messages, tool_choice={"type": "any"}, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": weather}])
    assert message.stop_reason == "max_tokens"
    assert [(b.type, b.name) for b in message.content] == [("tool_use", "get_weather")]


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


def test_prompt_logprobs_temperature_divides_the_logits(server):
    """vLLM's prompt_logprobs_temperature: each prompt token's logprob is transformers' log_softmax(logits / T),
    whatever the sampling temperature; a temperature of 0 or below is a 400."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = [5, 17, 29, 41, 53, 65]
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    for temperature in (0.5, 2.0):
        reply = requests.post(f"{server.base_url}/v1/completions", json={
            "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0,
            "prompt_logprobs_temperature": temperature}).json()
        ref = torch.log_softmax(logits / temperature, dim=-1)
        entries = reply["choices"][0]["prompt_logprobs"]
        assert [entries[i][str(ids[i])]["logprob"] for i in range(1, len(ids))] == \
            pytest.approx([ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=1e-4)
    for bad in (0, -1):
        refused = requests.post(f"{server.base_url}/v1/completions", json={
            "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "prompt_logprobs_temperature": bad})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs_temperature"
