"""Qwen's tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in the output.

Text outside the blocks is content. While streaming, content is released as
it comes (minus a tail that could open a block), and each call is released
whole once its closing tag arrives, so a partial tag never leaks. An output
that ends inside a block (cut by max_tokens) ends with the call as far as it
got, never with the block's raw JSON as content.
"""

import json
import re
import uuid
from dataclasses import dataclass, field

from deployments.parsers.tag_stream import split_at

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


class ToolCallParser:
    def __init__(self):
        self._pending = ""
        self._in_call = False
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Consume a chunk; returns (content delta, tool calls completed in it)."""
        self._pending += text
        content, calls = "", []
        while self._pending:
            tag = CLOSE if self._in_call else OPEN
            before, after, held = split_at(self._pending, tag)
            if after is None:
                if not self._in_call:
                    content += before
                    self._pending = held
                break
            if self._in_call:
                calls.append(_parse_call(before))
            else:
                content += before
            self._pending, self._in_call = after, not self._in_call
        self.calls += calls
        return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left at the end: held text as content; an unclosed block as the call it began, its arguments
        as far as they got (none when the output ended before the call's name did)."""
        pending, self._pending = self._pending, ""
        if not self._in_call:
            return pending, []
        call = _parse_partial_call(pending)
        self.calls += [call] if call else []
        return "", [call] if call else []


def _parse_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
        name = call["name"]
        arguments = call.get("arguments", call.get("parameters", {}))
    except (json.JSONDecodeError, KeyError, TypeError):
        return ToolCall(name="", arguments=body.strip())  # malformed: surfaced, not dropped
    return ToolCall(name=name, arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))


_PARTIAL_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*"(?:arguments|parameters)"\s*:\s*(.*))?',
                           re.DOTALL)


def _parse_partial_call(body: str) -> ToolCall | None:
    """The call an unclosed block began: whole if its JSON is, else its name and the arguments' text so far."""
    try:
        json.loads(body)
        return _parse_call(body)
    except json.JSONDecodeError:
        pass
    match = _PARTIAL_CALL.match(body)
    try:
        name = json.loads(f'"{match.group(1)}"') if match else None
    except json.JSONDecodeError:  # an escape the model never finished
        name = None
    return None if name is None else ToolCall(name=name, arguments=(match.group(2) or "").rstrip())


TOOL_CALL_PARSERS = {"qwen25": ToolCallParser, "hermes": ToolCallParser}
