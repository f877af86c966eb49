"""Each family's tool-call format read back into OpenAI's calls, at every split of a stream and every cut of an
output, and one served app whose model writes GLM-4.5's format."""

import json

import pytest

from deployments.parsers import TOOL_CALL_FORMATS, tool_call_parser
from tests.conftest import MODEL_ID, another_app, app_args
from tests.deployments.api.test_reasoning_and_tools import forced

SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                     "code": {"type": "string"}}},
    "get_time": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
TOOLS = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()]
CALLS = [("get_weather", {"city": "Paris", "days": 3, "code": "075"}), ("get_time", {"zone": "CET"})]
CONTENT = "Checking."

# the two calls as each format writes them
WRITTEN = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "code": "075"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                   "</parameter>\n<parameter=code>\n075\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                   "<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
             "<arg_value>3</arg_value>\n<arg_key>code</arg_key>\n<arg_value>075</arg_value>\n</tool_call>"
             "\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  '<parameter name="days">3</parameter>\n<parameter name="code">075</parameter>\n</invoke>\n'
                  '<invoke name="get_time">\n<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>',
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                   '{"city": "Paris", "days": 3, "code": "075"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
                   '<｜tool▁sep｜>get_time\n```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v31": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3, '
                    '"code": "075"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}'
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               '{"city": "Paris", "days": 3, "code": "075"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
               '<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>',
}


# ... and as the formats whose calls are the whole output write them
WHOLE = [
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3, "code": "075"}}'
                    '; {"name": "get_time", "parameters": {"zone": "CET"}}'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3, "code": "075"}}\n'
                    '{"name": "get_time", "parameters": {"zone": "CET"}}'),
    ("pythonic", '[get_weather(city="Paris", days=3, code="075"), get_time(zone="CET")]'),
    ("pythonic", '<|python_start|>[get_weather(city="Paris", days=3, code="075"), get_time(zone="CET")]'
                 "<|python_end|>"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "code": "075"}}, '
                '{"name": "get_time", "arguments": {"zone": "CET"}}]'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3, "code": "075"}[TOOL_CALLS]get_time[ARGS]'
                '{"zone": "CET"}'),
    ("pythonic", '<|python_tag|>[get_weather(city="Paris", days=3, code="075"), get_time(zone="CET")]'),
]
ALIASES = {"qwen25": "hermes", "qwen3_xml": "qwen3_coder", "glm47": "glm45", "llama4_json": "llama3_json",
           "llama4_pythonic": "pythonic"}


def parser(name: str):
    return tool_call_parser(TOOL_CALL_FORMATS[name](SCHEMAS))


def test_every_format_has_its_example():
    assert set(WRITTEN) | {name for name, _ in WHOLE} == set(TOOL_CALL_FORMATS) - set(ALIASES)
    assert all(TOOL_CALL_FORMATS[alias] is TOOL_CALL_FORMATS[name] for alias, name in ALIASES.items())


@pytest.mark.parametrize("name", list(WRITTEN))
def test_calls_read_the_same_at_every_split_of_the_stream(name):
    text = CONTENT + WRITTEN[name] + " Done."
    for cut in range(len(text) + 1):
        p = parser(name)
        pieces = [p.feed(text[:cut]), p.feed(text[cut:]), p.finish()]
        assert "".join(c for c, _ in pieces) == CONTENT + " Done.", cut
        calls = [call for _, cs in pieces for call in cs]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS, cut
        assert p.calls == calls
    if name == "kimi_k2":  # its own ids, which its chat template writes back
        assert [c.id for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    else:
        assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


@pytest.mark.parametrize("name", list(WRITTEN))
def test_an_output_cut_inside_a_call_ends_with_the_call_so_far_and_no_markup(name):
    """Cut by max_tokens anywhere after the calls' markup opened, up to the first call's end: none of it is
    content, and the call, once its name is whole, is named and has arguments as far as they got."""
    form = TOOL_CALL_FORMATS[name]
    opened, first_closed = len((form.sections[0] if form.sections else form.call)[0]), WRITTEN[name].index(form.call[1])
    for end in range(len(CONTENT) + opened, len(CONTENT) + first_closed):
        p = parser(name)
        content, calls = p.feed((CONTENT + WRITTEN[name])[:end])
        rest, unclosed = p.finish()
        assert content + rest == CONTENT and calls == [] and p.calls == unclosed, end
        assert len(unclosed) <= 1 and all(c.name == "get_weather" for c in unclosed), (end, unclosed)
        for call in unclosed:
            whole = json.dumps(CALLS[0][1])
            if call.arguments.startswith("{") and call.arguments.endswith("}") and _is_json(call.arguments):
                assert json.loads(call.arguments).items() <= CALLS[0][1].items(), (end, call)
            else:
                assert whole.startswith(call.arguments), (end, call)
    assert unclosed, "the longest cut has the call's name"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("name, text", WHOLE)
def test_whole_output_calls_read_the_same_at_every_split(name, text):
    for cut in range(len(text) + 1):
        p = parser(name)
        pieces = [p.feed(" " + text[:cut]), p.feed(text[cut:]), p.finish()]
        assert "".join(content for content, _ in pieces).strip() == "", cut
        calls = [call for _, cs in pieces for call in cs]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS and p.calls == calls, cut
    if name == "mistral":  # the only ids its chat templates take back
        assert all(len(c.id) == 9 and c.id.isalnum() for c in calls)


@pytest.mark.parametrize("name, answer", [
    ("llama3_json", '{"answer": 42}'), ("llama3_json", '{"name": "get_time", "parameters": {"zone": "C'),
    ("pythonic", "[1, 2]"), ("pythonic", '[get_weather(city="Par'), ("pythonic", '[get_weather(city=open("x"))]'),
    ("pythonic", "[get_weather(**kwargs)]"), ("mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\""),
])
def test_a_whole_output_that_is_not_calls_is_content(name, answer):
    """A JSON answer, a list, a cut call, a call whose arguments are not literals (never run): content, as
    written."""
    p = parser(name)
    assert p.feed(answer) == ("", []) and p.finish() == (answer, []) and p.calls == []


@pytest.mark.parametrize("name", sorted({name for name, _ in WHOLE}))
def test_an_answer_that_opens_no_call_streams_as_it_comes(name):
    p = parser(name)
    first = p.feed(" ")[0]  # too short to tell, but where calls may follow text
    assert first == ("" if not p.format.anywhere else " ")
    assert first + p.feed("It is sunny. [1]")[0] == " It is sunny. [1]"
    assert p.feed(" {x}") == (" {x}", []) and p.finish() == ("", [])


@pytest.mark.parametrize("name", ["glm45", "minimax_m2"])
def test_text_values_are_read_by_the_schemas_types(name):
    """A value the schema types a string stays text ("075"); others are JSON where they parse, text where not,
    and a tool or parameter the schemas lack is read as JSON where it can be."""
    call = parser(name).format.parse(
        "ask\n<arg_key>n</arg_key><arg_value>[1, 2]</arg_value><arg_key>s</arg_key><arg_value>not json</arg_value>"
        if name == "glm45" else
        '"ask">\n<parameter name="n">[1, 2]</parameter><parameter name="s">not json</parameter>')
    assert (call.name, json.loads(call.arguments)) == ("ask", {"n": [1, 2], "s": "not json"})


def test_whitespace_after_a_call_is_dropped_unless_text_follows():
    p = parser("hermes")
    call = WRITTEN["hermes"].split("\n<tool_call>")[0]
    pieces = [p.feed(call + "\n"), p.feed("\n"), p.finish()]
    assert [c for c, _ in pieces] == ["", "", ""] and len(p.calls) == 1
    p = parser("hermes")
    assert p.feed(call + "\n")[0] == "" and p.feed("Done.")[0] == "\nDone."


def test_kimis_singular_section_tags_are_read_too():
    singular = WRITTEN["kimi_k2"].replace("tool_calls_section", "tool_call_section")
    p = parser("kimi_k2")
    content, calls = p.feed(CONTENT + singular)
    assert content + p.finish()[0] == CONTENT and [(c.name, json.loads(c.arguments)) for c in calls] == CALLS


def test_mistrals_calls_after_the_turns_text():
    p = parser("mistral")
    text = "I'll check." + dict(WHOLE)["mistral"].replace("get_time[ARGS]", "get_time[CALL_ID]a1b2c3d4e[ARGS]")
    pieces = [p.feed(text[:20]), p.feed(text[20:]), p.finish()]
    assert "".join(c for c, _ in pieces) == "I'll check."
    calls = [call for _, cs in pieces for call in cs]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS and calls[1].id == "a1b2c3d4e"


def test_a_json_answer_naming_no_tool_is_content():
    answer = '{"name": "Bob", "parameters": {"age": 3}}'
    p = parser("llama3_json")
    assert p.feed(answer) == ("", []) and p.finish() == (answer, [])


def test_values_are_text_wherever_the_schema_takes_text_and_python_literals_are_read():
    schemas = {"f": {"properties": {"maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                    "pick": {"enum": ["1", "2"]}, "body": {"type": "string"},
                                    "flag": {"type": "boolean"}, "nothing": {}}}}
    call = TOOL_CALL_FORMATS["glm45"](schemas).parse(
        "f\n<arg_key>maybe</arg_key><arg_value>12345</arg_value><arg_key>pick</arg_key><arg_value>1</arg_value>"
        "<arg_key>body</arg_key><arg_value>\n  line\n</arg_value><arg_key>flag</arg_key><arg_value>True</arg_value>"
        "<arg_key>nothing</arg_key><arg_value>None</arg_value>")
    assert json.loads(call.arguments) == {"maybe": "12345", "pick": "1", "body": "\n  line\n", "flag": True,
                                          "nothing": None}


def test_a_malformed_call_is_surfaced_not_dropped():
    p = parser("glm45")
    content, calls = p.feed("<tool_call><arg_key>city</arg_key></tool_call>")
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("", "<arg_key>city</arg_key>")]


@pytest.fixture(scope="module")
def glm_client(server, tmp_path_factory):
    """The shared model served as one that writes GLM-4.5's calls."""
    import openai

    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('glm-storage')}")
    args["llm_configs"][0].update(tool_call_parser="glm45", engine_kwargs={**server.engine_kwargs, "warm_up": False})
    with another_app(server, "glm", args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None")


def test_a_served_model_writing_glm_calls_answers_with_openai_tool_calls(glm_client):
    """Whole and streamed, the same typed call; a forced tool choice is decoded in the forcing grammar's format
    and read in it, whatever the model's. (One short call: the tiny model's context is 512 tokens.)"""
    messages = [{"role": "user", "content": "Weather?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer"}, "code": {"type": "string"}}}}}, TOOLS[1]]
    written = ("<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>code</arg_key>\n"
               "<arg_value>075</arg_value>\n</tool_call>")
    expected = [("get_weather", {"days": 3, "code": "075"})]
    body = forced(CONTENT + written)
    reply = glm_client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools, max_tokens=150,
                                               extra_body=body)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == CONTENT
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == expected
    chunks = list(glm_client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools, max_tokens=150,
                                                     stream=True, extra_body=body))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [(t.function.name, json.loads(t.function.arguments)) for d in deltas for t in d.tool_calls or []]
    assert streamed == expected and "".join(d.content or "" for d in deltas) == CONTENT
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    required = glm_client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools[1:], max_tokens=60,
                                                  tool_choice="required", temperature=0)
    [call] = required.choices[0].message.tool_calls
    assert call.function.name == "get_time" and set(json.loads(call.function.arguments)) <= {"zone"}


@pytest.mark.parametrize("name", sorted(TOOL_CALL_FORMATS))
@pytest.mark.parametrize("value", ["1" * 5000, "[" * 100_000, '"\\ud800"'])
def test_a_value_no_json_reader_takes_leaves_the_reply_whole(name, value):
    """A number over int's digit limit, nesting past the recursion limit, a lone surrogate: the call is surfaced
    (or its text is content), never an exception that would fail the request."""
    text = {**WRITTEN, **dict(WHOLE)}[ALIASES.get(name, name)].replace("3", value, 1)  # the "days" value
    p = parser(name)
    content, calls = p.feed(CONTENT + text)
    rest, more = p.finish()
    assert (content + rest).startswith(CONTENT) and len(calls + more) <= 2
    for call in calls + more:  # what the reply carries encodes
        (call.name + call.arguments).encode()


def test_a_name_no_reply_could_encode_is_not_a_call():
    p = parser("hermes")
    text = WRITTEN["hermes"].replace("get_weather", "\\ud800")
    content, calls = p.feed(text)
    calls += p.finish()[1]
    assert [c.name for c in calls] == ["", "get_time"] and calls[0].arguments.startswith('{"name": "\\ud800"')
