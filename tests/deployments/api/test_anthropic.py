"""Anthropic's Messages API through the `anthropic` SDK: the same tokens as the chat route, text, thinking and
tool_use blocks (outputs forced by a grammar), the streamed event sequence and its accumulated message,
count_tokens, and errors in Anthropic's shape."""

import json
import re

import anthropic
import pytest
import requests

from runtime import EngineConfig
from tests.conftest import MODEL_ID
from tests.deployments.api.test_reasoning_and_tools import CALL, THOUGHT

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="None")


def forced(text: str) -> dict:
    return {"ebnf": "root ::= " + json.dumps(text)}


def test_a_message_is_the_chat_completion_of_the_same_conversation(claude, client):
    system, user = "Be brief.", "What is the capital of France?"
    message = claude.messages.create(model=MODEL_ID, max_tokens=12, system=system, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": user}])
    chat = client.chat.completions.create(model=MODEL_ID, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}])
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL_ID
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    # Anthropic's input_tokens leave out what came from the cache (an earlier test may have cached the prefix)
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    counted = claude.messages.count_tokens(model=MODEL_ID, system=system, messages=[{"role": "user", "content": user}])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_thinking_and_tool_use_blocks(claude):
    message = claude.messages.create(model=MODEL_ID, max_tokens=120, tools=[WEATHER], extra_body=forced(
        THOUGHT.replace("It is 4.", "") + CALL), messages=[{"role": "user", "content": "Weather in Paris?"}],
                                     thinking={"type": "enabled", "budget_tokens": 100})
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.content[0].thinking.strip() == "The user wants a number."
    call = message.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and message.stop_reason == "tool_use"
    # the call's result goes back as a tool_result block; the conversation renders and runs
    follow = claude.messages.create(model=MODEL_ID, max_tokens=4, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}])
    prompt = follow.usage.input_tokens + follow.usage.cache_read_input_tokens  # the prefix came from the cache
    assert prompt > message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_stop_sequences_are_named(claude):
    message = claude.messages.create(model=MODEL_ID, max_tokens=40, stop_sequences=["capital"],
                                     extra_body=forced("The capital is Paris."),
                                     messages=[{"role": "user", "content": "x"}])
    assert message.content[0].text == "The " and message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "capital"


def test_the_stream_is_anthropics_event_sequence(server, claude):
    # greedy: the grammar allows many tokenizations of the forced text, and both calls must pick the same one
    greedy = {**forced(THOUGHT + CALL), "temperature": 0}
    kwargs = dict(model=MODEL_ID, max_tokens=120, tools=[WEATHER], extra_body=greedy,
                  messages=[{"role": "user", "content": "x"}], thinking={"type": "enabled", "budget_tokens": 100})
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    whole = claude.messages.create(**kwargs)
    body = {**{k: v for k, v in kwargs.items() if k != "extra_body"}, **kwargs["extra_body"], "stream": True}
    raw = requests.post(f"{server.base_url}/v1/messages", json=body)
    events = [block.split("\n") for block in raw.text.split("\n\n") if block]
    kinds = [name.removeprefix("event: ") for name, _ in events]
    assert kinds == [json.loads(data.removeprefix("data: "))["type"] for _, data in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    assert [b.type for b in final.content] == [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert final.content[1].text == whole.content[1].text and final.content[2].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == whole.usage.output_tokens


def test_errors_are_in_anthropics_shape(server, claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL_ID, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):  # as Anthropic's: below max_tokens
        claude.messages.create(model=MODEL_ID, max_tokens=100, messages=[{"role": "user", "content": "x"}],
                               thinking={"type": "enabled", "budget_tokens": 100})
    for choice, tools in (({"type": "tool", "name": "nowhere"}, [WEATHER]), ({"type": "any"}, None)):
        for route in ("/v1/messages", "/v1/messages/count_tokens"):
            refused = requests.post(f"{server.base_url}{route}", json={
                "model": MODEL_ID, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                "tool_choice": choice, **({"tools": tools} if tools else {})})
            assert refused.status_code == 400 and "tool_choice" in refused.json()["error"]["message"], refused.text
    reply = requests.post(f"{server.base_url}/v1/messages", json={"model": MODEL_ID, "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]})
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "image" in body["error"]["message"]


def test_a_system_turn_inside_the_conversation_is_rendered_where_it_stands(claude, client):
    """Claude Code sends a `system` message inside `messages`; it renders as the chat route renders the same
    conversation, and count_tokens counts it."""
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
             {"role": "user", "content": "What is the capital of France?"}]
    message = claude.messages.create(model=MODEL_ID, max_tokens=6, messages=turns, extra_body={"temperature": 0})
    chat_turns = [{**t, "content": t["content"][0]["text"]} if isinstance(t["content"], list) else t for t in turns]
    chat = client.chat.completions.create(model=MODEL_ID, max_tokens=6, temperature=0, messages=chat_turns)
    assert message.content[0].text == chat.choices[0].message.content
    assert claude.messages.count_tokens(model=MODEL_ID, messages=turns).input_tokens == chat.usage.prompt_tokens


def test_context_overflow_is_worded_as_anthropics_so_claude_code_recovers(server, claude):
    """Claude Code parses these two messages: it lowers max_tokens on the first and compacts on the second."""
    counted = claude.messages.count_tokens(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}]).input_tokens
    with pytest.raises(anthropic.BadRequestError) as over:
        claude.messages.create(model=MODEL_ID, max_tokens=8000, messages=[{"role": "user", "content": "hi"}])
    assert over.value.body["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {counted} + 8000 > 512, decrease input length or "
        "`max_tokens` and try again")
    long = " ".join(["word"] * 600)
    with pytest.raises(anthropic.BadRequestError) as too_long:
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": long}])
    message = too_long.value.body["error"]["message"]
    assert re.fullmatch(r"prompt is too long: (\d+) tokens > 512 maximum", message)
    assert int(re.fullmatch(r"prompt is too long: (\d+) tokens > 512 maximum", message).group(1)) >= 512


def test_a_last_assistant_turn_is_continued_as_a_prefill(claude, client):
    """Anthropic's prefill and chat's continue_final_message: the model goes on writing the last assistant turn
    (the prompt is the conversation with that turn left open), and the reply holds only what it adds."""
    turns = [{"role": "user", "content": "The capital of France?"}, {"role": "assistant", "content": "The capital is"}]
    prompt = "<|im_start|>user\nThe capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is"
    raw = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0)
    chat = client.chat.completions.create(model=MODEL_ID, max_tokens=6, temperature=0, messages=turns, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})
    assert chat.choices[0].message.content == raw.choices[0].text
    assert chat.usage.prompt_tokens == raw.usage.prompt_tokens
    message = claude.messages.create(model=MODEL_ID, max_tokens=6, messages=turns, extra_body={"temperature": 0})
    assert "".join(b.text for b in message.content) == raw.choices[0].text
    assert claude.messages.count_tokens(model=MODEL_ID, messages=turns).input_tokens == raw.usage.prompt_tokens


def test_an_echoed_thinking_block_is_the_turns_reasoning():
    from deployments.api.anthropic.protocol import MessagesRequest

    req = MessagesRequest.model_validate({"model": MODEL_ID, "max_tokens": 8, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                                          {"type": "redacted_thinking", "data": "x"},
                                          {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]})
    assistant = req.to_chat().messages[1]
    assert assistant.reasoning_content == "Call the tool." and assistant.tool_calls[0]["id"] == "t1"


def test_cache_control_marks_what_is_written_and_the_next_turn_reads_it(server, claude):
    """A system prompt marked with cache_control: the first turn writes the tokens up to the mark (none were
    cached: the prompt is new); later turns read the whole blocks they share with earlier prompts from the prefix
    cache and write only what of the marked prefix was not read; each turn's three counts add up to its prompt,
    in a stream too. Without marks nothing is written."""
    from transformers import AutoTokenizer

    text = "You review code for a living, carefully and kindly. " * 8 + "cache-test"
    system = [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)

    def ids(question: str | None) -> list[int]:
        messages = [{"role": "system", "content": text}] + [{"role": "user", "content": question}] * bool(question)
        return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=bool(question),
                                             return_dict=False)

    marked, block, earlier = len(ids(None)), EngineConfig.block_size, []

    def read_from_cache(prompt: list[int]) -> int:
        common = max((next((i for i, (a, b) in enumerate(zip(p, prompt)) if a != b), min(len(p), len(prompt)))
                      for p in earlier), default=0)
        return common // block * block

    for question, stream in (("Is this loop right?", False), ("And this one?", False), ("And the last?", True)):
        messages = [{"role": "user", "content": question}]
        if stream:
            with claude.messages.stream(model=MODEL_ID, max_tokens=2, system=system, messages=messages) as events:
                usage = events.get_final_message().usage
        else:
            usage = claude.messages.create(model=MODEL_ID, max_tokens=2, system=system, messages=messages).usage
        prompt = ids(question)
        read = read_from_cache(prompt)
        assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (read, max(0, marked - read))
        assert usage.input_tokens + read + usage.cache_creation_input_tokens == len(prompt)
        earlier.append(prompt)
    assert server.engine_stats()["num_pinned_blocks"] >= marked // block  # kept in preference for five minutes
    unmarked = claude.messages.create(model=MODEL_ID, max_tokens=2, system=text,
                                      messages=[{"role": "user", "content": "No marks?"}]).usage
    assert unmarked.cache_creation_input_tokens == 0 and unmarked.cache_read_input_tokens > 0


def test_cache_control_pins_the_marked_prefix_for_the_marks_ttl():
    """The chat request of a marked Messages request pins the prompt's tokens up to the last mark, for an hour
    when a mark says so, else five minutes; an unmarked one pins nothing."""
    import asyncio

    from deployments.api.anthropic.protocol import MessagesRequest
    from deployments.http.anthropic.handler import cache_breakpoint, chat_request

    class Counted:  # the model's /tokenize: the marked prefix's token count
        async def tokenize(self, req):
            return {"count": 40 + len(req.messages)}

    def pinned(system, tools=None) -> tuple[int, float]:
        req = MessagesRequest.model_validate({"model": MODEL_ID, "max_tokens": 2, "system": system, "tools": tools,
                                              "messages": [{"role": "user", "content": "hi"}]})
        chat = chat_request(req)
        asyncio.run(cache_breakpoint(req, chat, Counted()))
        return chat.pin_prefix_tokens, chat.pin_ttl_s

    block = {"type": "text", "text": "Be brief."}
    tool = {"name": "t", "input_schema": {"type": "object"}}
    assert pinned([{**block, "cache_control": {"type": "ephemeral"}}]) == (41, 300)
    assert pinned([block], [{**tool, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]) == (41, 3600)
    assert pinned([block], [tool]) == (0, 300)
