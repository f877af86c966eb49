"""gpt-oss's harmony format: prompts rendered and outputs parsed by openai-harmony, on the real o200k_base
vocabulary rebuilt offline (testing/harmony_vocab.py)."""

import pytest

from deployments.parsers.harmony import HarmonyParser
from deployments.parsers.tool_calls import ToolCall
from deployments.replica.choice_parser import HarmonyChoiceParser
from runtime.text.harmony_chat import harmony_encoding, render_harmony, stop_token_ids

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
THINK_THEN_ANSWER = ("<|channel|>analysis<|message|>The user greets.<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>")
THINK_THEN_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
                   '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                   '{"city": "Paris"}<|call|>')


pytestmark = pytest.mark.usefixtures("harmony_vocab")


def ids(text: str) -> list[int]:
    return harmony_encoding().encode(text, allowed_special="all")


def parse(token_ids: list[int], chunk: int) -> tuple[list[tuple[str, str, list[ToolCall]]], HarmonyParser]:
    parser = HarmonyParser()
    deltas = [parser.feed(token_ids[i : i + chunk]) for i in range(0, len(token_ids), chunk)]
    deltas.append(("", parser.finish(), []))
    return deltas, parser


def joined(deltas) -> tuple[str, str, list[ToolCall]]:
    return ("".join(d[0] for d in deltas), "".join(d[1] for d in deltas), [c for d in deltas for c in d[2]])


def test_vocabulary_is_o200k_base_and_stops_are_return_and_call():
    assert ids("<|channel|>analysis<|message|>Hello world") == [200005, 35644, 200008, 13225, 2375]
    assert stop_token_ids() == [200002, 200012]


def test_analysis_then_final():
    token_ids = ids(THINK_THEN_ANSWER)
    deltas, parser = parse(token_ids, len(token_ids))
    assert joined(deltas) == ("The user greets.", "Hello there!", [])
    assert parser.reasoning_tokens == len(ids("<|channel|>analysis<|message|>The user greets.<|end|>"))
    assert parser.calls == []


def test_tool_call_in_commentary():
    deltas, parser = parse(ids(THINK_THEN_CALL), 1000)
    reasoning, content, calls = joined(deltas)
    assert (reasoning, content) == ("Need the weather.", "")
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    assert parser.calls == calls


@pytest.mark.parametrize("text, thought", [(THINK_THEN_ANSWER, "The user greets."),
                                           (THINK_THEN_CALL, "Need the weather.")])
def test_token_by_token_deltas_concatenate_to_the_whole(text, thought):
    token_ids = ids(text)
    whole, _ = parse(token_ids, len(token_ids))
    streamed, _ = parse(token_ids, 1)
    assert [(c.name, c.arguments) for c in joined(streamed)[2]] == [(c.name, c.arguments) for c in joined(whole)[2]]
    assert joined(streamed)[:2] == joined(whole)[:2]
    # reasoning streams as it comes; a call is released whole by the token that ends it
    reasoning = [d[0] for d in streamed if d[0]]
    assert reasoning == [harmony_encoding().decode([t]) for t in ids(thought)]
    calls_at = [i for i, d in enumerate(streamed) if d[2]]
    assert calls_at == ([] if text == THINK_THEN_ANSWER else [len(token_ids) - 1])


def test_a_call_cut_short_is_content():
    cut = THINK_THEN_CALL.removesuffix("<|call|>")
    deltas, parser = parse(ids(cut), 3)
    assert joined(deltas) == ("Need the weather.", '{"city": "Paris"}', [])
    assert parser.calls == []


def test_output_harmony_refuses_is_content_at_the_end():
    deltas, _ = parse(ids("<|channel|>final<|message|>Hi<|end|>stray text"), 2)
    assert joined(deltas) == ("", "Histray text", [])
    assert deltas[-1] == ("", "stray text", [])


def test_unfinished_reasoning_counts_every_token():
    token_ids = ids("<|channel|>analysis<|message|>Still thinking")
    deltas, parser = parse(token_ids, 4)
    assert joined(deltas) == ("Still thinking", "", [])
    assert parser.reasoning_tokens == len(token_ids)


def test_render_conversation_with_tools_effort_and_a_tool_result():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    prompt = render_harmony(messages, [WEATHER_TOOL], reasoning_effort="low")
    assert harmony_encoding().decode(prompt) == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n"
        "} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18C<|end|>"
        "<|start|>assistant")


def test_render_plain_conversation_has_no_developer_message():
    prompt = render_harmony([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                             {"role": "user", "content": "Bye"}])
    assert harmony_encoding().decode(prompt) == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\n"
        "Reasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>user<|message|>Hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello<|end|>"
        "<|start|>user<|message|>Bye<|end|><|start|>assistant")


def test_a_tool_result_must_answer_a_call():
    with pytest.raises(ValueError, match="tool_call_id 'nope'"):
        render_harmony([{"role": "user", "content": "Hi"}, {"role": "tool", "tool_call_id": "nope", "content": "x"}])


@pytest.mark.parametrize("separate, expected", [(True, ("Need the weather.", "")), (False, ("", "Need the weather."))])
def test_the_choice_parser_keeps_or_joins_reasoning(separate, expected):
    parser = HarmonyChoiceParser(separate)
    token_ids = ids(THINK_THEN_CALL)
    deltas = [parser.feed("ignored", token_ids[:5], False), parser.feed("ignored", token_ids[5:], True)]
    assert ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)) == expected
    assert [(c.name, c.arguments) for d in deltas for c in d.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert parser.made_tool_calls
    assert parser.reasoning_tokens == (len(ids("<|channel|>analysis<|message|>Need the weather.<|end|>"))
                                       if separate else 0)
