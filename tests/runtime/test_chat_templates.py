"""A conversation's earlier tool calls through chat templates written the ways the families' are: each reads the
arguments the client sent as a JSON string in the form it expects (a mapping; DeepSeek's, which joins them to
strings, the text as sent)."""

import pytest

from runtime.text.tokenizer import render_chat
from testing.model_factory import build_tokenizer

ARGUMENTS = '{"city": "Paris", "days": 3}'
MESSAGES = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}},
        {"id": "call_2", "type": "function", "function": {"name": "broken", "arguments": "{not json"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
# the part of each family's template that writes a call's arguments
CALL_LOOP = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% set f = c.function %}[{}]{% endfor %}"
             "{% endfor %}")
TEMPLATES = {
    "glm45": ("<tool_call>{{ f.name }}{% if f.arguments is mapping %}{% for k, v in f.arguments.items() %}<arg_key>"
              "{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson }}</arg_value>{% endfor %}"
              "{% else %}{{ f.arguments }}{% endif %}</tool_call>",
              "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
              "<arg_value>3</arg_value></tool_call><tool_call>broken{not json</tool_call>"),
    "qwen2.5": ('{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}',
                '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
                '{"name": "broken", "arguments": "{not json"}'),
    "qwen3": ("{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}",
              ARGUMENTS + "{not json"),
    "deepseek_v3": ("{{ f.name + '\\n```json\\n' + f.arguments + '\\n```' }}",
                    "get_weather\n```json\n" + ARGUMENTS + "\n```broken\n```json\n{not json\n```"),
}


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_call_arguments_read_as_each_template_expects(family):
    body, expected = TEMPLATES[family]
    template = CALL_LOOP.replace("[{}]", body)
    assert render_chat(build_tokenizer(), MESSAGES, None, {"chat_template": template},
                       add_generation_prompt=False) == expected
    assert MESSAGES[1]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS  # the caller's messages unchanged


def test_arguments_no_json_reader_takes_go_to_the_template_as_sent():
    """Nesting past the recursion limit, a number over int's digit limit: the text as the client sent it."""
    for text in ("[" * 100_000, '{"n": ' + "1" * 5000 + "}"):
        messages = [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}]}]
        template = CALL_LOOP.replace("[{}]", "{{ f.arguments }}")
        assert render_chat(build_tokenizer(), messages, None, {"chat_template": template},
                           add_generation_prompt=False) == text
