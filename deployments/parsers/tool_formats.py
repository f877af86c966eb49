"""The formats model families write tool calls in, by the names `tool_call_parser` takes (vLLM's names).

- hermes, qwen25: Qwen 2.5/3, Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- glm45: GLM-4.5 and later: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>`
- minimax_m2: `<minimax:tool_call>` around `<invoke name="NAME"><parameter name="K">V</parameter></invoke>`s
- deepseek_v3, deepseek_v31: `<｜tool▁calls▁begin｜>` around `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`s, each
  `function<｜tool▁sep｜>NAME` then the arguments in a json code fence (V3, R1), or `NAME<｜tool▁sep｜>ARGS` (V3.1)
- kimi_k2: `<|tool_calls_section_begin|>` around `<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>
  ARGS<|tool_call_end|>`s; `functions.NAME:I` is the call's id, which Kimi's chat template writes back

Formats whose values are text (GLM's, MiniMax's) read each value by the type the tool's schema gives it.
"""

import json
import re

from deployments.parsers.tool_calls import ToolCall, ToolCallFormat


def _malformed(body: str) -> ToolCall:
    return ToolCall(name="", arguments=body.strip())


class HermesFormat(ToolCallFormat):
    def parse(self, body: str) -> ToolCall:
        try:
            call = json.loads(body)
            name = call["name"]
            arguments = call.get("arguments", call.get("parameters", {}))
        except (json.JSONDecodeError, KeyError, TypeError):
            return _malformed(body)
        return ToolCall(name=name, arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))

    _PARTIAL = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*"(?:arguments|parameters)"\s*:\s*(.*))?',
                          re.DOTALL)

    def parse_partial(self, body: str) -> ToolCall | None:
        try:
            json.loads(body)
            return self.parse(body)
        except json.JSONDecodeError:
            pass
        match = self._PARTIAL.match(body)
        try:
            name = json.loads(f'"{match.group(1)}"') if match else None
        except json.JSONDecodeError:  # an escape the model never finished
            name = None
        return None if name is None else ToolCall(name=name, arguments=(match.group(2) or "").rstrip())


def _typed_arguments(schema: dict | None, pairs: list[tuple[str, str]]) -> str:
    """Values written as text, as a call's JSON arguments: text where the tool's schema types the parameter a
    string, else read as JSON where they are (numbers, booleans, arrays, objects), else text."""
    properties = (schema or {}).get("properties") or {}
    arguments = {}
    for key, value in pairs:
        key, value = key.strip(), value.strip("\n")
        kind = properties.get(key, {}).get("type") if isinstance(properties.get(key), dict) else None
        if kind == "string" or isinstance(kind, list) and "string" in kind:
            arguments[key] = value
            continue
        try:
            arguments[key] = json.loads(value)
        except ValueError:
            arguments[key] = value
    return json.dumps(arguments, ensure_ascii=False)


class Glm45Format(ToolCallFormat):
    special_tokens = True
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

    def parse(self, body: str) -> ToolCall:
        return self._read(body, whole=True) or _malformed(body)

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


class MinimaxM2Format(ToolCallFormat):
    section = ("<minimax:tool_call>", "</minimax:tool_call>")
    call = ("<invoke name=", "</invoke>")
    special_tokens = True
    _NAME = re.compile(r'\s*"?([^"<>\n]+)"?\s*>')
    _PARAMETER = re.compile(r'<parameter name="?([^"<>]*)"?>(.*?)</parameter>', re.DOTALL)

    def parse(self, body: str) -> ToolCall:
        return self.parse_partial(body) or _malformed(body)

    def parse_partial(self, body: str) -> ToolCall | None:
        match = self._NAME.match(body)
        if match is None:
            return None
        name = match.group(1).strip()
        pairs = self._PARAMETER.findall(body, match.end())
        return ToolCall(name=name, arguments=_typed_arguments(self.schemas.get(name), pairs))


class DeepSeekFormat(ToolCallFormat):
    section = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    special_tokens = True
    SEP = "<｜tool▁sep｜>"

    def parse(self, body: str) -> ToolCall:
        call = self._read(body, whole=True)
        return call if call and call.name else _malformed(body)

    def parse_partial(self, body: str) -> ToolCall | None:
        return self._read(body, whole=False)

    def _read(self, body: str, whole: bool) -> ToolCall | None:
        head, sep, rest = body.partition(self.SEP)
        if not sep:
            return None
        if head.strip() == "function" and ("```" in rest or not whole):  # V3's: the name, then a fenced block
            name, newline, arguments = rest.partition("\n")
            if not newline:
                return None
            fenced = arguments.strip()
            arguments = "" if "```json".startswith(fenced) else fenced.removeprefix("```json").rstrip("`")
        else:
            name, arguments = head, rest
        return ToolCall(name=name.strip(), arguments=arguments.strip() or ("{}" if whole else ""))


class KimiK2Format(ToolCallFormat):
    section = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    call = ("<|tool_call_begin|>", "<|tool_call_end|>")
    special_tokens = True
    ARGUMENTS = "<|tool_call_argument_begin|>"

    def parse(self, body: str) -> ToolCall:
        call = self.parse_partial(body)
        if not call or not call.name:
            return _malformed(body)
        call.arguments = call.arguments or "{}"
        return call

    def parse_partial(self, body: str) -> ToolCall | None:
        ident, sep, arguments = body.partition(self.ARGUMENTS)
        if not sep:
            return None
        ident = ident.strip()
        name = ident.split(".", 1)[-1].rsplit(":", 1)[0]  # functions.NAME:I
        return ToolCall(name=name, arguments=arguments.strip(), id=ident)


TOOL_CALL_FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat, "qwen25": HermesFormat, "glm45": Glm45Format, "minimax_m2": MinimaxM2Format,
    "deepseek_v3": DeepSeekFormat, "deepseek_v31": DeepSeekFormat, "kimi_k2": KimiK2Format,
}
# the format of a forced call (tool_choice "required" or a named function), whatever the model's: the grammar
# that forces it writes this one (runtime/text/grammar_process.py)
FORCED_CALL_FORMAT = "hermes"
