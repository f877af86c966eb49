"""/v1/responses through the `openai` SDK: the same tokens as the chat route for the same conversation, every
reply and streamed event valid under the SDK's own types (strictly), reasoning and function-call items,
stored responses continued with `previous_response_id` (on another app that shares the storage, too),
retrieved and deleted; background responses polled, cancelled, and read as failed once no replica runs them; their
streams read again from any event, ended by a cancel, outliving their reader."""

import json
import time

import openai
import pytest
import requests
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args
from tests.deployments.api.test_reasoning_and_tools import CALL, THOUGHT, WEATHER_TOOL, forced

EVENTS = TypeAdapter(ResponseStreamEvent)
FLAT_WEATHER_TOOL = {"type": "function", **WEATHER_TOOL["function"]}


def create(server, **body) -> dict:
    """A non-streamed response as raw JSON, checked against the SDK's `Response` type strictly."""
    r = requests.post(f"{server.base_url}/v1/responses", json={"model": MODEL_ID, **body})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    return r.json()


def stream(server, **body) -> list[dict]:
    """A streamed response's events as raw JSON, each checked against the SDK's event types strictly."""
    r = requests.post(f"{server.base_url}/v1/responses", json={"model": MODEL_ID, "stream": True, **body}, stream=True)
    events = events_of(r)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def events_of(r: requests.Response) -> list[dict]:
    """An event stream's events, named by their types and valid under the SDK's types."""
    assert r.status_code == 200, r.text
    events, names = [], []
    for block in r.text.split("\n\n"):
        if block:
            name, data = block.split("\n")
            names.append(name.removeprefix("event: "))
            events.append(json.loads(data.removeprefix("data: ")))
    assert names == [e["type"] for e in events]
    for event in events:
        EVENTS.validate_python(event)
    return events


def chat(client, messages, **kwargs):
    return client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, **kwargs)


def test_a_response_is_the_chat_completion_of_the_same_conversation(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    reference = chat(client, messages, max_tokens=6)
    response = create(server, input="hi there", instructions="Be brief.", max_output_tokens=6, temperature=0)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = response["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == reference.choices[0].message.content
    assert response["usage"]["input_tokens"] == reference.usage.prompt_tokens
    assert response["usage"]["output_tokens"] == 6 and response["usage"]["total_tokens"] == reference.usage.total_tokens
    sdk = client.responses.create(model=MODEL_ID, input=[{"role": "developer", "content": "Be brief."},
                                                          {"role": "user", "content": [
                                                              {"type": "input_text", "text": "hi there"}]}],
                                  max_output_tokens=6, temperature=0)
    assert sdk.output_text == reference.choices[0].message.content and sdk.id.startswith("resp_")


def test_streamed_events_come_in_order_and_add_up_to_the_reply(server):
    body = {"input": "count", "max_output_tokens": 8, "temperature": 0}
    events = stream(server, **body)
    assert [e["type"] for e in events[:4]] == ["response.created", "response.in_progress",
                                               "response.output_item.added", "response.content_part.added"]
    assert [e["type"] for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                                "response.output_item.done", "response.completed"]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 8
    text = final["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text == events[-4]["text"] == create(server, **body)["output"][0]["content"][0]["text"]


def test_sdk_streaming_and_logprobs(client):
    with client.responses.stream(model=MODEL_ID, input="hello", max_output_tokens=5, temperature=0,
                                 include=["message.output_text.logprobs"], top_logprobs=2) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    (part,) = final.output[0].content
    assert "".join(deltas) == final.output_text and len(part.logprobs) == 5
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)


def test_reasoning_becomes_a_reasoning_item(server):
    response = create(server, input="2+2?", max_output_tokens=60, **forced(THOUGHT))
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user wants a number.\n"}]
    assert message["content"][0]["text"] == "It is 4." and response["status"] == "completed"
    assert 0 < response["usage"]["output_tokens_details"]["reasoning_tokens"] < response["usage"]["output_tokens"]
    events = stream(server, input="2+2?", max_output_tokens=60, **forced(THOUGHT))
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thought == "The user wants a number.\n"
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["reasoning", "message"]


def test_function_calls_and_their_outputs_continue_the_conversation(server, client):
    response = create(server, input="Weather in Paris?", tools=[FLAT_WEATHER_TOOL], max_output_tokens=200,
                      **forced("Let me check." + CALL))
    message, call = response["output"]
    assert message["content"][0]["text"] == "Let me check."
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    events = stream(server, input="Weather in Paris?", tools=[FLAT_WEATHER_TOOL], max_output_tokens=200,
                    **forced("Let me check." + CALL))
    args = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(args) == 1 and json.loads(args[0]["arguments"]) == {"city": "Paris"}

    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    followed = create(server, previous_response_id=response["id"], input=[result], tools=[FLAT_WEATHER_TOOL],
                      max_output_tokens=2, temperature=0)
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "Let me check.", "tool_calls": [{
                   "id": call["call_id"], "type": "function",
                   "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
               {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}]
    reference = chat(client, history, tools=[WEATHER_TOOL], max_tokens=2)
    assert followed["usage"]["input_tokens"] == reference.usage.prompt_tokens
    assert followed["output"][0]["content"][0]["text"] == reference.choices[0].message.content
    # a client that keeps its own history sends the items back instead of an id: the same prompt
    echoed = create(server, input=[{"role": "user", "content": "Weather in Paris?"}, *response["output"], result],
                    tools=[FLAT_WEATHER_TOOL], max_output_tokens=2, temperature=0, store=False)
    assert echoed["usage"]["input_tokens"] == reference.usage.prompt_tokens


def test_stored_responses_are_continued_retrieved_and_deleted(server, client, tmp_path_factory):
    first = client.responses.create(model=MODEL_ID, input="My name is Ada.", max_output_tokens=3, temperature=0)
    second = client.responses.create(model=MODEL_ID, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=3, temperature=0)
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "What is my name?"}]
    reference = chat(client, history, max_tokens=3)
    assert second.usage.input_tokens == reference.usage.prompt_tokens
    assert second.output_text == reference.choices[0].message.content
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL_ID, input="again", previous_response_id=first.id)
    assert missing.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=MODEL_ID, input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_conversation_continues_on_another_app_sharing_the_storage(server, client, tmp_path_factory):
    storage = f"file://{tmp_path_factory.mktemp('shared-responses')}"
    with another_app(server, "resp_a", app_args(server.model_dir, storage)) as a, \
            another_app(server, "resp_b", app_args(server.model_dir, storage)) as b:
        first = openai.Client(base_url=f"{a}/v1", api_key="x").responses.create(
            model=MODEL_ID, input="My name is Ada.", max_output_tokens=3, temperature=0)
        on_b = openai.Client(base_url=f"{b}/v1", api_key="x")
        assert on_b.responses.retrieve(first.id).output_text == first.output_text
        second = on_b.responses.create(model=MODEL_ID, input="Name?", previous_response_id=first.id,
                                       max_output_tokens=2, temperature=0)
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Name?"}]
    assert second.usage.input_tokens == chat(client, history, max_tokens=1).usage.prompt_tokens


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "input_image", "image_url": "http://x"}]}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "tool_choice": "required"}, None),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "previous_response_id": "../public/resp_" + "0" * 32}, "previous_response_id"),  # no paths
    ({"input": "x", "model": "no-such-model"}, "model"),
    ({"input": "x", "tools": 5}, "tools"),
    ({"input": "x", "include": ["message.output_text.logprobs"] * 10_000}, "include"),
    ({"input": []}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),  # nothing to answer
])
def test_bad_requests_are_openai_errors(server, body, param):
    r = requests.post(f"{server.base_url}/v1/responses", json={"model": MODEL_ID, **body})
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_json_schema_text_format(server):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    response = create(server, input="a number", max_output_tokens=40, temperature=1, seed=3,
                      text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    assert isinstance(json.loads(response["output"][0]["content"][0]["text"])["n"], int)
    assert response["text"]["format"]["name"] == "num"


def test_instructions_and_leading_system_items_make_one_system_message(server, client):
    response = create(server, instructions="Be brief.", max_output_tokens=2, temperature=0,
                      input=[{"role": "developer", "content": "Use French."}, {"role": "user", "content": "hi"}])
    reference = chat(client, [{"role": "system", "content": "Be brief.\n\nUse French."},
                              {"role": "user", "content": "hi"}], max_tokens=2)
    assert response["usage"]["input_tokens"] == reference.usage.prompt_tokens


def test_streamed_and_whole_replies_have_the_same_items(server):
    """Whitespace between two tool calls makes no message item in either; held-back text keeps its logprobs."""
    two_calls = CALL + "\n" + CALL
    body = {"input": "Weather?", "tools": [FLAT_WEATHER_TOOL], "max_output_tokens": 200,
            "include": ["message.output_text.logprobs"], **forced(THOUGHT.split("It is")[0] + two_calls)}
    whole = create(server, **body)
    streamed = stream(server, **body)[-1]["response"]
    assert [i["type"] for i in whole["output"]] == [i["type"] for i in streamed["output"]] == \
        ["reasoning", "function_call", "function_call"]
    text_body = {"input": "x", "max_output_tokens": 60, "include": ["message.output_text.logprobs"],
                 **forced("It is <4> or <tool" + "_call> not.")}
    whole, streamed = create(server, **text_body), stream(server, **text_body)[-1]["response"]
    assert whole["output"][0]["content"] == streamed["output"][0]["content"]


def test_input_items_are_listed_through_the_sdk(server, client):
    """`client.responses.input_items.list(id)`: the request's input as items, newest first, paged."""
    first = client.responses.create(model=MODEL_ID, input="What is the weather?", max_output_tokens=2)
    (only,) = client.responses.input_items.list(first.id).data
    assert only.type == "message" and only.role == "user" and only.content[0].text == "What is the weather?"
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
             {"role": "user", "content": [{"type": "input_text", "text": "and tomorrow?"}]}]
    second = client.responses.create(model=MODEL_ID, input=items, tools=[FLAT_WEATHER_TOOL], max_output_tokens=2,
                                     previous_response_id=first.id)
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in listed.data] == ["message", "function_call", "function_call_output", "message"]
    assert listed.data[2].output == "sunny" and listed.data[1].call_id == "call_1"
    newest = client.responses.input_items.list(second.id, limit=3)
    assert [i.id for i in newest.data] == [i.id for i in listed.data[::-1][:3]] and newest.has_more
    rest = client.responses.input_items.list(second.id, limit=3, after=newest.data[-1].id)
    assert [i.id for i in rest.data] == [listed.data[0].id] and not rest.has_more
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_" + "0" * 32)


# what Codex CLI sends: plain functions, a namespace of them, and a hosted web search it does not need us to run
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
NAMESPACE = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "wait", "strict": False, "parameters": {"type": "object"}},
    {"type": "function", "name": "get_weather", "parameters": CITY}]}
CODEX_TOOLS = [{"type": "function", "name": "get_weather", "parameters": CITY}, NAMESPACE,
               {"type": "web_search", "external_web_access": False}]


def test_namespaced_tools_are_flattened_and_hosted_tools_dropped(server):
    """A function in a namespace is called back by its own name with its namespace (get_weather is in both
    places: the model tells them apart by the qualified name, the client by the namespace field); a hosted tool
    is dropped and named in x-ignored-fields; forcing one is a 400."""
    body = {"model": MODEL_ID, "input": "x", "tools": CODEX_TOOLS, "max_output_tokens": 120, "temperature": 0,
            "tool_choice": {"type": "function", "name": "get_weather", "namespace": "agents"}}
    r = requests.post(f"{server.base_url}/v1/responses", json=body)
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "tools.web_search", r.text
    Response.model_validate(r.json())
    (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("get_weather", "agents")
    assert r.json()["tools"][2] == CODEX_TOOLS[2]
    events = stream(server, **{k: v for k, v in body.items() if k != "model"})
    (done,) = [e["item"] for e in events if e["type"] == "response.output_item.done"
               and e["item"]["type"] == "function_call"]
    assert (done["name"], done["namespace"], done["arguments"]) == ("get_weather", "agents", call["arguments"])
    # Codex sends the call back with its namespace, and the tool's output
    follow = create(server, tools=CODEX_TOOLS, max_output_tokens=4, input=[
        {"role": "user", "content": "x"}, {k: call[k] for k in ("type", "call_id", "name", "arguments", "namespace")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert follow["status"] in ("completed", "incomplete")
    plain = create(server, input="x", tools=CODEX_TOOLS, max_output_tokens=120, temperature=0,
                   tool_choice={"type": "function", "name": "get_weather"})
    (top,) = [item for item in plain["output"] if item["type"] == "function_call"]
    assert top["name"] == "get_weather" and "namespace" not in top
    forced_hosted = requests.post(f"{server.base_url}/v1/responses", json={
        "model": MODEL_ID, "input": "x", "tools": CODEX_TOOLS, "tool_choice": {"type": "web_search"}})
    assert forced_hosted.status_code == 400 and forced_hosted.json()["error"]["param"] == "tool_choice"


def _settled(client, response_id: str):
    """The background response once it has left queued and in_progress."""
    return wait_until(lambda: (r := client.responses.retrieve(response_id)).status not in ("queued", "in_progress")
                      and r, timeout=60, every=0.1)


def test_a_background_response_is_polled_to_the_same_reply(server, client):
    reference = client.responses.create(model=MODEL_ID, input="Tell me about Paris.", max_output_tokens=8,
                                        temperature=0)
    queued = client.responses.create(model=MODEL_ID, input="Tell me about Paris.", max_output_tokens=8,
                                     temperature=0, background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = _settled(client, queued.id)
    assert done.status == "incomplete" and done.background is True and done.id == queued.id
    assert done.output_text == reference.output_text and done.usage.output_tokens == 8
    follow = client.responses.create(model=MODEL_ID, input="And Rome?", previous_response_id=done.id,
                                     max_output_tokens=2, temperature=0)
    assert follow.status == "incomplete"
    assert [i.content[0].text for i in client.responses.input_items.list(queued.id).data] == ["Tell me about Paris."]


def test_a_background_response_is_cancelled(server, client):
    running = client.responses.create(model=MODEL_ID, input="A long story, please.", max_output_tokens=400,
                                      background=True, extra_body={"ignore_eos": True})
    wait_until(lambda: client.responses.retrieve(running.id).status == "in_progress", timeout=30, every=0.05)
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and client.responses.cancel(running.id).status == "cancelled"
    wait_until(lambda: server.engine_stats()["num_requests"] == 0, timeout=30)  # the engine stopped the turn
    assert client.responses.retrieve(running.id).status == "cancelled"
    finished = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=1)
    for response_id, status in ((finished.id, 400), ("resp_" + "0" * 32, 404)):
        r = requests.post(f"{server.base_url}/v1/responses/{response_id}/cancel")
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text


def test_a_background_response_no_replica_runs_reads_as_failed(server, client):
    """A record left in_progress with no stamp for a minute: its replica died (or was stopped past its drain)."""
    response = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=1, background=True)
    _settled(client, response.id)
    (path,) = (server.storage / "responses").rglob(f"{response.id}.json")
    record = json.loads(path.read_text())
    record["response"]["status"] = "in_progress"
    path.write_text(json.dumps(record))
    stamp = server.storage / "response-stamps" / path.relative_to(server.storage)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(time.time() - 3600))  # its replica's last stamp, an hour ago
    lost = client.responses.retrieve(response.id)
    assert lost.status == "failed" and lost.error.code == "server_error" and "stopped" in lost.error.message
    assert client.responses.retrieve(response.id).status == "failed"


def replay(server, response_id: str, **params) -> requests.Response:
    return requests.get(f"{server.base_url}/v1/responses/{response_id}", params={"stream": "true", **params},
                        stream=True)


def test_a_background_stream_is_read_again_from_any_event(server, client):
    reference = client.responses.create(model=MODEL_ID, input="Tell me about Rome.", max_output_tokens=6,
                                        temperature=0)
    events = stream(server, input="Tell me about Rome.", max_output_tokens=6, temperature=0, background=True)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_text.delta") >= 1
    assert events[0]["response"]["status"] == "queued" and events[0]["response"]["background"] is True
    done = events[-1]["response"]
    assert done["status"] == "incomplete" and done["output"][0]["content"][0]["text"] == reference.output_text
    assert requests.get(f"{server.base_url}/v1/responses/{done['id']}").json() == done
    assert events_of(replay(server, done["id"])) == events  # from the store: its turn has ended
    assert events_of(replay(server, done["id"], starting_after=4)) == events[5:]
    with client.responses.stream(response_id=done["id"], starting_after=4) as resumed:
        assert [e.sequence_number for e in resumed] == list(range(5, len(events)))
        assert resumed.get_final_response().output_text == reference.output_text
    foreground = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=1)
    polled = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=1, background=True)
    for response_id, params, status, param in ((foreground.id, {}, 400, "stream"), (polled.id, {}, 400, "stream"),
                                               (done["id"], {"starting_after": -1}, 400, "starting_after"),
                                               ("resp_" + "0" * 32, {}, 404, None)):
        r = replay(server, response_id, **params)
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    _settled(client, polled.id)


def test_a_background_stream_outlives_its_reader_and_ends_when_cancelled(server, client):
    body = {"model": MODEL_ID, "stream": True, "background": True, "input": "A story.", "temperature": 0}
    # long enough that its reader's leaving reaches the server mid-turn (Serve cancels what a request started)
    turn = {**body, "max_output_tokens": 200, "ignore_eos": True}
    with requests.post(f"{server.base_url}/v1/responses", json=turn, stream=True) as r:
        lines = r.iter_lines()
        assert next(lines) == b"event: response.created"
        response_id = json.loads(next(lines).removeprefix(b"data: "))["response"]["id"]
    done = _settled(client, response_id)  # its reader left after the first event
    assert done.status == "incomplete" and done.usage.output_tokens == 200, done.error
    assert events_of(replay(server, response_id))[-1]["response"]["usage"]["output_tokens"] == 200

    long = {**body, "max_output_tokens": 400, "ignore_eos": True}
    with requests.post(f"{server.base_url}/v1/responses", json=long, stream=True) as r:
        lines = (line for line in r.iter_lines() if line.startswith(b"data: "))
        seen = []
        while not seen or seen[-1]["type"] != "response.output_text.delta":
            seen.append(json.loads(next(lines).removeprefix(b"data: ")))
        assert client.responses.cancel(seen[0]["response"]["id"]).status == "cancelled"
        seen += [json.loads(line.removeprefix(b"data: ")) for line in lines]
    assert seen[-1] == {"type": "error", "sequence_number": len(seen) - 1, "code": "response_cancelled",
                        "message": "the response was cancelled", "param": None}
    wait_until(lambda: server.engine_stats()["num_requests"] == 0, timeout=30)  # the engine stopped the turn
    assert events_of(replay(server, seen[0]["response"]["id"])) == seen
