"""Parsers that split generated text into reasoning, content and tool calls, incrementally."""

from deployments.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from deployments.parsers.tool_calls import ToolCall, ToolCallFormat
from deployments.parsers.tool_formats import FORCED_CALL_FORMAT, TOOL_CALL_FORMATS, tool_call_parser

__all__ = ["FORCED_CALL_FORMAT", "REASONING_PARSERS", "TOOL_CALL_FORMATS", "ReasoningParser", "ToolCall",
           "ToolCallFormat", "tool_call_parser"]
