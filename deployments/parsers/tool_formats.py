"""The formats model families write tool calls in, by the names `tool_call_parser` takes (vLLM's names).

- hermes, qwen25: Qwen 2.5/3, Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- qwen3_coder, qwen3_xml: Qwen3-Coder: `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>...`
- glm45, glm47: GLM-4.5 and later: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>`
- minimax_m2: `<minimax:tool_call>` around `<invoke name="NAME"><parameter name="K">V</parameter></invoke>`s
- deepseek_v3, deepseek_v31: `<｜tool▁calls▁begin｜>` around `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`s, each
  `function<｜tool▁sep｜>NAME` then the arguments in a json code fence (V3, R1), or `NAME<｜tool▁sep｜>ARGS` (V3.1)
- kimi_k2: `<|tool_calls_section_begin|>` around `<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>
  ARGS<|tool_call_end|>`s; `functions.NAME:I` is the call's id, which Kimi's chat template writes back
- llama3_json, llama4_json: the output is `{"name": ..., "parameters": {...}}` (several joined by `;`), maybe
  after `<|python_tag|>`
- pythonic, llama4_pythonic: the output is `[get_weather(city="Paris"), ...]`, maybe in `<|python_start|>...`
  or after `<|python_tag|>`
- mistral: after the turn's text, `[TOOL_CALLS]` and a JSON list of calls, or `[TOOL_CALLS]NAME[ARGS]{...}` per
  call

Formats whose values are text (Qwen3-Coder's, GLM's, MiniMax's) read each value by the type the tool's schema gives it.
"""

import ast
import json
import re
import uuid

from deployments.parsers.leading_calls import LeadingCallsFormat, LeadingCallsParser
from deployments.parsers.tool_calls import TaggedFormat, ToolCall, ToolCallFormat, ToolCallParser

# what reading a model's text as JSON may raise (a number over int's digit limit is a plain ValueError; nesting
# past the recursion limit a RecursionError)
NOT_JSON = (ValueError, RecursionError)


def _json_text(arguments) -> str:
    """Arguments as JSON text, its characters as they are unless one is a lone surrogate (read from a `\\ud800`
    escape), which no reply could encode: then all escaped."""
    text = json.dumps(arguments, ensure_ascii=False)
    return text if _encodes(text) else json.dumps(arguments)


def _named_call(call) -> ToolCall | None:
    """`{"name": ..., "arguments" (or "parameters"): {...}}` as a call; None when it is not one (or holds a lone
    surrogate, from a `\\ud800` escape, that no reply could encode)."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    arguments = arguments if isinstance(arguments, str) else _json_text(arguments)
    return ToolCall(name=call["name"], arguments=arguments) if _encodes(call["name"] + arguments) else None


def _encodes(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


class HermesFormat(TaggedFormat):
    special_tokens = True  # some checkpoints mark <tool_call> special

    def parse(self, body: str) -> ToolCall:
        try:
            call = _named_call(json.loads(body))
        except NOT_JSON:
            call = None
        return call or self.malformed(body)

    _PARTIAL = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*"(?:arguments|parameters)"\s*:\s*(.*))?',
                          re.DOTALL)

    def parse_partial(self, body: str) -> ToolCall | None:
        try:
            json.loads(body)
            return self.parse(body)
        except NOT_JSON:
            pass
        match = self._PARTIAL.match(body)
        try:
            name = json.loads(f'"{match.group(1)}"') if match else None
        except NOT_JSON:  # an escape the model never finished
            name = None
        if name is None or not _encodes(name):
            return None
        return ToolCall(name=name, arguments=(match.group(2) or "").rstrip())


def _typed_arguments(schema: dict | None, pairs: list[tuple[str, str]]) -> str:
    """Values written as text, as a call's JSON arguments: verbatim where the tool's schema takes text for the
    parameter, else read as JSON (or a Python literal: True, None) where they are one, else text."""
    properties = (schema or {}).get("properties") or {}
    named = [(key.strip(), value) for key, value in pairs]
    return _json_text({key: value if _takes_text(properties.get(key)) else _value(value.strip())
                       for key, value in named})


def _takes_text(schema) -> bool:
    """A string type (alone, among others, or in one of anyOf/oneOf), or an enum or const of strings only."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or isinstance(kind, list) and "string" in kind:
        return True
    if any(_takes_text(option) for key in ("anyOf", "oneOf") for option in schema.get(key) or []):
        return True
    values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
    return bool(values) and all(isinstance(v, str) for v in values)


def _value(text: str):
    for read in (json.loads, ast.literal_eval):
        try:
            value = read(text)
            json.dumps(value)  # a set or bytes is not an argument
            return value
        except (*NOT_JSON, TypeError, SyntaxError, MemoryError):
            pass
    return text


class Glm45Format(TaggedFormat):
    special_tokens = True
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

    def parse(self, body: str) -> ToolCall:
        return self._read(body, whole=True) or self.malformed(body)

    def parse_partial(self, body: str) -> ToolCall | None:
        return self._read(body, whole=False)

    def _read(self, body: str, whole: bool) -> ToolCall | None:
        """The name runs to a newline or the first key (to the end of a whole call that has no arguments)."""
        body = body.lstrip()
        ends = [i for i in (body.find("\n"), body.find("<arg_key>")) if i != -1]
        if not ends and not whole:
            return None
        name = body[: min(ends, default=len(body))].strip()
        if not name or "<" in name:
            return None
        return ToolCall(name=name, arguments=_typed_arguments(self.schemas.get(name), self._PAIR.findall(body)))


class ParameterTagsFormat(TaggedFormat):
    """The name in the call's opening, then a tag per parameter holding its value as text (Qwen3-Coder's,
    MiniMax's)."""

    special_tokens = True
    NAME: re.Pattern
    PARAMETER: re.Pattern  # key, value
    framing = ""  # what the template writes on each side of a value

    def parse_partial(self, body: str) -> ToolCall | None:
        match = self.NAME.match(body)
        if match is None:
            return None
        name = match.group(1).strip()
        pairs = [(key, value.removeprefix(self.framing).removesuffix(self.framing))
                 for key, value in self.PARAMETER.findall(body, match.end())]
        return ToolCall(name=name, arguments=_typed_arguments(self.schemas.get(name), pairs))


class Qwen3CoderFormat(ParameterTagsFormat):
    NAME = re.compile(r"\s*<function=([^>\n]+)>")
    PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
    framing = "\n"  # each value on lines of its own


class MinimaxM2Format(ParameterTagsFormat):
    sections = (("<minimax:tool_call>", "</minimax:tool_call>"),)
    call = ("<invoke name=", "</invoke>")
    NAME = re.compile(r'\s*"?([^"<>\n]+)"?\s*>')
    PARAMETER = re.compile(r'<parameter name="?([^"<>]*)"?>(.*?)</parameter>', re.DOTALL)


class DeepSeekFormat(TaggedFormat):
    sections = (("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),)
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    special_tokens = True
    SEP = "<｜tool▁sep｜>"

    def parse_partial(self, body: str) -> ToolCall | None:
        head, sep, rest = body.partition(self.SEP)
        if not sep:
            return None
        if head.strip() != "function":  # V3.1's: the name, then the arguments
            return ToolCall(name=head.strip(), arguments=rest.strip())
        name, newline, fenced = rest.partition("\n")  # V3's: the name, then the arguments in a json code fence
        if not newline:
            return None
        fenced = fenced.strip()
        arguments = "" if "```json".startswith(fenced) else fenced.removeprefix("```json").rstrip("`")
        return ToolCall(name=name.strip(), arguments=arguments.strip())


class KimiK2Format(TaggedFormat):
    # some checkpoints write the singular
    sections = (("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
                ("<|tool_call_section_begin|>", "<|tool_call_section_end|>"))
    call = ("<|tool_call_begin|>", "<|tool_call_end|>")
    special_tokens = True
    ARGUMENTS = "<|tool_call_argument_begin|>"

    def parse_partial(self, body: str) -> ToolCall | None:
        ident, sep, arguments = body.partition(self.ARGUMENTS)
        if not sep:
            return None
        ident = ident.strip()
        name = ident.split(".", 1)[-1].rsplit(":", 1)[0]  # functions.NAME:I
        return ToolCall(name=name, arguments=arguments.strip(), id=ident)


class LlamaJsonFormat(LeadingCallsFormat):
    leading = ("<|python_tag|>", "{")
    special_tokens = True

    def parse_all(self, text: str) -> list[ToolCall] | None:
        text, decoder, calls, at = text.removeprefix("<|python_tag|>").strip(), json.JSONDecoder(), [], 0
        while at < len(text):
            try:
                call, at = decoder.raw_decode(text, at)
            except NOT_JSON:
                return None
            calls.append(_named_call(call))
            while at < len(text) and text[at] in " \t\n;":
                at += 1
        if not calls or None in calls or any(c.name not in self.schemas for c in calls):
            return None  # an answer in JSON, not a call of one of the request's tools
        return calls


class PythonicFormat(LeadingCallsFormat):
    leading = ("[", "<|python_start|>", "<|python_tag|>")
    special_tokens = True

    def parse_all(self, text: str) -> list[ToolCall] | None:
        """Read as Python's syntax tree, never run: each call a name with keyword arguments of literal values."""
        text = text.removeprefix("<|python_tag|>").removeprefix("<|python_start|>").removesuffix("<|python_end|>")
        text = text.strip()
        try:
            tree = ast.parse(text, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            calls = []
            for node in tree.elts:
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                        and all(k.arg for k in node.keywords)):
                    return None
                arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                calls.append(ToolCall(name=node.func.id, arguments=_json_text(arguments)))
            return calls
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return None


class MistralFormat(LeadingCallsFormat):
    leading = ("[TOOL_CALLS]",)
    anywhere = True  # its templates write a turn's text, then its calls
    special_tokens = True

    def parse_all(self, text: str) -> list[ToolCall] | None:
        """A JSON list of calls after `[TOOL_CALLS]` (Mistral's v3 tokenizers), or `NAME[ARGS]{...}` after each
        (v11 and later; `NAME[CALL_ID]ID[ARGS]{...}` with the id). Ids are 9 letters and digits: Mistral's chat
        templates take no other back."""
        parts = [part.strip() for part in text.split("[TOOL_CALLS]") if part.strip()]
        if len(parts) == 1 and parts[0].startswith("["):
            try:
                listed = json.loads(parts[0])
            except NOT_JSON:
                return None
            calls = [_named_call(c) for c in listed] if isinstance(listed, list) else []
        else:
            calls = [self._name_and_arguments(part) for part in parts]
        if not calls or None in calls:
            return None
        for call in calls:
            call.id = call.id if len(call.id) == 9 and call.id.isalnum() else uuid.uuid4().hex[:9]
        return calls

    @staticmethod
    def _name_and_arguments(part: str) -> ToolCall | None:
        name, sep, arguments = part.partition("[ARGS]")
        try:
            json.loads(arguments)
        except NOT_JSON:
            return None
        name, _, call_id = name.partition("[CALL_ID]")
        if not sep or not name.strip():
            return None
        return ToolCall(name=name.strip(), arguments=arguments.strip(), id=call_id.strip())


TOOL_CALL_FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat, "qwen25": HermesFormat, "qwen3_coder": Qwen3CoderFormat, "qwen3_xml": Qwen3CoderFormat,
    "glm45": Glm45Format, "glm47": Glm45Format, "minimax_m2": MinimaxM2Format,
    "deepseek_v3": DeepSeekFormat, "deepseek_v31": DeepSeekFormat, "kimi_k2": KimiK2Format,
    "llama3_json": LlamaJsonFormat, "llama4_json": LlamaJsonFormat, "pythonic": PythonicFormat,
    "llama4_pythonic": PythonicFormat, "mistral": MistralFormat,
}
# the format of a forced call (tool_choice "required" or a named function), whatever the model's: the grammar
# that forces it writes this one (runtime/text/grammar_process.py)
FORCED_CALL_FORMAT = "hermes"


def tool_call_parser(tool_format: ToolCallFormat) -> ToolCallParser | LeadingCallsParser:
    return (LeadingCallsParser if isinstance(tool_format, LeadingCallsFormat) else ToolCallParser)(tool_format)
