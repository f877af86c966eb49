"""Reasoning and tool-call parsing: the parsers on every split of scripted text, then end to end with
outputs forced by an EBNF grammar (the random model can only write the scripted text)."""

import json

import openai
import pytest

from deployments.parsers import REASONING_PARSERS, ReasoningParser
from tests.conftest import MODEL_ID

THOUGHT = "<think>\nThe user wants a number.\n</think>\n\nIt is 4."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}


def forced(text: str) -> dict:
    """extra_body that makes the model write exactly `text` (greedy, so always in the same tokens)."""
    return {"ebnf": "root ::= " + json.dumps(text), "temperature": 0}


def _chunks(text: str, cut: int) -> list[str]:
    return [text[:cut], text[cut:]]


@pytest.mark.parametrize("cut", range(0, len(THOUGHT) + 1))
def test_reasoning_parser_at_every_split(cut):
    parser = ReasoningParser(starts_in_reasoning=False)
    parts = [parser.feed(c) for c in _chunks(THOUGHT, cut)] + [parser.finish()]
    assert "".join(r for r, _ in parts) == "The user wants a number.\n"
    assert "".join(c for _, c in parts) == "It is 4."
    assert not any("<" in r or "<" in c for r, c in parts)  # no partial tag leaks


def test_deepseek_r1_starts_inside_reasoning_and_truncation_is_all_reasoning():
    parser = ReasoningParser(starts_in_reasoning=True)
    assert parser.feed("still thinking") == ("still thinking", "")
    assert parser.finish() == ("", "")


@pytest.mark.parametrize("name, prompt_tail, output, parsed", [
    ("qwen3", "<|im_start|>assistant\n", "<think>\nHm.\n</think>\n\nIt is 4.", ("Hm.\n", "It is 4.")),
    ("qwen3", "<|im_start|>assistant\n", "It is 4.", ("", "It is 4.")),
    # a thinking-only template opens the block in its generation prompt
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Hm.\n</think>\n\nIt is 4.", ("Hm.\n", "It is 4.")),
    ("deepseek-r1", "<｜Assistant｜><think>\n", "Hm.\n</think>\n\nIt is 4.", ("Hm.\n", "It is 4.")),
    ("deepseek-r1", "<｜Assistant｜>", "Hm.\n</think>\n\nIt is 4.", ("Hm.\n", "It is 4.")),
    # thinking switched off: the template closed the block in the prompt
    ("deepseek-r1", "<｜Assistant｜></think>", "It is 4.", ("", "It is 4.")),
    ("glm45", "<|assistant|>\n<think></think>\n", "It is 4.", ("", "It is 4.")),
])
def test_the_prompts_end_says_whether_the_output_starts_in_reasoning(name, prompt_tail, output, parsed):
    parser = REASONING_PARSERS[name](prompt_tail)
    reasoning, content = parser.feed(output)
    rest = parser.finish()
    assert (reasoning + rest[0], content + rest[1]) == parsed


def test_reasoning_is_separated(client):
    messages = [{"role": "user", "content": "2 + 2?"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=200, extra_body={
        **forced(THOUGHT), "chat_template_kwargs": {"enable_thinking": True}, "separate_reasoning": True})  # the seed's
    message = r.choices[0].message
    assert message.reasoning_content == "The user wants a number.\n" and message.content == "It is 4."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    assert r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    stream = list(client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=200, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body=forced(THOUGHT)))
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == "It is 4."
    assert stream[-1].usage.completion_tokens_details.reasoning_tokens == \
        r.usage.completion_tokens_details.reasoning_tokens
    raw = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=200,
                                         extra_body={**forced(THOUGHT), "separate_reasoning": False})
    assert raw.choices[0].message.content == THOUGHT and raw.choices[0].message.reasoning_content is None


def test_a_prompt_that_opened_the_reasoning_block_gets_its_reasoning_separated(client):
    """As a thinking-only template's generation prompt does (here the last assistant turn, left open)."""
    messages = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "<think>\n"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=200, extra_body={
        **forced(THOUGHT.removeprefix("<think>\n")), "continue_final_message": True, "add_generation_prompt": False})
    message = r.choices[0].message
    assert message.reasoning_content == "The user wants a number.\n" and message.content == "It is 4."
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens


def test_truncated_reasoning_and_thinking_switch(client):
    messages = [{"role": "user", "content": "2 + 2?"}]
    cut = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20,
                                         extra_body=forced(THOUGHT))
    assert cut.choices[0].finish_reason == "length"
    reasoning = cut.choices[0].message.reasoning_content
    assert reasoning and "The user wants a number.".startswith(reasoning.rstrip("\n"))
    assert not cut.choices[0].message.content
    on = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=1)
    off = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the template closed an empty think block


def test_auto_tool_call_is_parsed(client):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    kwargs = dict(model=MODEL_ID, messages=messages, tools=[WEATHER_TOOL], max_tokens=200,
                  extra_body=forced("Let me check." + CALL))
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    contents = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(contents) == "Let me check." and not any("<" in c for c in contents)
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(streamed) == 1 and streamed[0].index == 0 and streamed[0].function.name == "get_weather"
    assert json.loads(streamed[0].function.arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    none = client.chat.completions.create(**{**kwargs, "tool_choice": "none"})
    assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content

    twice = {**kwargs, "extra_body": forced("Let me check." + CALL + CALL.replace("Paris", "Lyon"))}
    both = client.chat.completions.create(**twice)
    assert [json.loads(c.function.arguments)["city"] for c in both.choices[0].message.tool_calls] == ["Paris", "Lyon"]
    first = client.chat.completions.create(**twice, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in first.choices[0].message.tool_calls] == ["Paris"]
    chunks = list(client.chat.completions.create(**twice, parallel_tool_calls=False, stream=True))
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [json.loads(tc.function.arguments)["city"] for tc in streamed] == ["Paris"]


def test_required_and_named_tool_choice_are_enforced(client):
    messages = [{"role": "user", "content": "anything"}]
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                                           tool_choice="required", temperature=1.0, seed=seed, max_tokens=120)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)
        named = client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], temperature=1.0, seed=seed,
            max_tokens=120, tool_choice={"type": "function", "function": {"name": "get_time"}})
        (call,) = named.choices[0].message.tool_calls
        assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
        assert named.choices[0].finish_reason == "tool_calls"


def test_tool_results_in_history_are_rendered(client):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    short = client.chat.completions.create(model=MODEL_ID, messages=history[:1], tools=[WEATHER_TOOL], max_tokens=1)
    full = client.chat.completions.create(model=MODEL_ID, messages=history, tools=[WEATHER_TOOL], max_tokens=1)
    longer = client.chat.completions.create(model=MODEL_ID, messages=history[:2] + [
        {**history[2], "content": "sunny, 21 C, light wind from the west"}], tools=[WEATHER_TOOL], max_tokens=1)
    assert short.usage.prompt_tokens < full.usage.prompt_tokens < longer.usage.prompt_tokens


def test_bad_tool_requests_are_400(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}],
                                       tools=[WEATHER_TOOL], tool_choice={"type": "function",
                                                                          "function": {"name": "missing"}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}],
                                       tool_choice="required")


@pytest.mark.parametrize("cut", range(0, 8))
def test_text_without_a_reasoning_block_is_content_untouched(cut):
    text = "  plain answer\n"
    parser = ReasoningParser(starts_in_reasoning=False)
    parts = [parser.feed(c) for c in _chunks(text, cut)] + [parser.finish()]
    assert "".join(r for r, _ in parts) == "" and "".join(c for _, c in parts) == text


def test_echoed_reasoning_reaches_the_chat_template_under_either_name():
    """Templates that keep reasoning within a tool-calling turn (Qwen3's, Kimi's, MiniMax's) get it back."""
    from deployments.api.chat.protocol import ChatCompletionRequest
    from runtime.text.tokenizer import render_chat
    from testing.model_factory import build_tokenizer

    template = "{% for m in messages %}[{{ m.role }}|{{ m.reasoning_content or '' }}|{{ m.content }}]{% endfor %}"
    for name in ("reasoning_content", "reasoning"):
        req = ChatCompletionRequest.model_validate({"model": MODEL_ID, "messages": [
            {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4", name: "Adding."}]})
        text = render_chat(build_tokenizer(), [m.template_dict() for m in req.messages], None,
                           {"chat_template": template}, add_generation_prompt=False)
        assert text == "[user||2 + 2?][assistant|Adding.|4]"
