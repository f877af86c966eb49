"""Parsers that split generated text into reasoning, content and tool calls, incrementally."""

from deployments.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from deployments.parsers.tool_calls import TOOL_CALL_PARSERS, ToolCall, ToolCallParser

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "ReasoningParser", "ToolCall", "ToolCallParser"]
