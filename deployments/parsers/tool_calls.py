"""Qwen's tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in the output.

Text outside the blocks is content. While streaming, content is released as
it comes (minus a tail that could open a block), and each call is released
whole once its closing tag arrives, so a partial tag never leaks.
"""

import json
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

    def finish(self) -> str:
        """Text left at the end: an unclosed block is returned as content, not lost."""
        pending, self._pending = self._pending, ""
        return (OPEN + pending) if self._in_call else pending


def _parse_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
        name = call["name"]
        arguments = call.get("arguments", call.get("parameters", {}))
    except (json.JSONDecodeError, KeyError, TypeError):
        return ToolCall(name="", arguments=body.strip())  # malformed: surfaced, not dropped
    return ToolCall(name=name, arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))


TOOL_CALL_PARSERS = {"qwen25": ToolCallParser, "hermes": ToolCallParser}
