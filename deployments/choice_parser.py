"""Turns one choice's stream of text into reasoning, content and tool-call deltas."""

from dataclasses import dataclass, field

from runtime.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, ToolCall


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChoiceParser:
    """Feed each step's text; the parsers hold back partial tags until they resolve."""

    def __init__(self, reasoning_parser: str | None, tool_call_parser: str | None):
        self.reasoning = REASONING_PARSERS[reasoning_parser]() if reasoning_parser else None
        self.tools = TOOL_CALL_PARSERS[tool_call_parser]() if tool_call_parser else None
        self.reasoning_tokens = 0

    def feed(self, text: str, num_tokens: int, final: bool) -> ChoiceDelta:
        """`num_tokens` generated tokens produced `text`; on the last call, everything held is released."""
        delta = ChoiceDelta()
        if self.reasoning is not None:
            was_reasoning = self.reasoning.in_reasoning
            delta.reasoning, delta.content = self.reasoning.feed(text)
            if was_reasoning or self.reasoning.in_reasoning:  # the tag tokens count as reasoning
                self.reasoning_tokens += num_tokens
            if final:
                reasoning, content = self.reasoning.finish()
                delta.reasoning += reasoning
                delta.content += content
        else:
            delta.content = text
        if self.tools is not None:
            delta.content, delta.tool_calls = self.tools.feed(delta.content)
            if final:
                delta.content += self.tools.finish()
        return delta

    @property
    def made_tool_calls(self) -> bool:
        return bool(self.tools and self.tools.calls)


def tool_call_json(index: int, call: ToolCall) -> dict:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}
