"""Tool calls that are the whole output: formats with no closing tag, whose calls start the output and run to its
end (Llama's JSON, the pythonic list, Mistral's `[TOOL_CALLS]`).

An output that begins (after whitespace) with one of the format's openings is held until it ends, then read as
calls; one that is not calls after all (a JSON answer, a list, a cut) is released as content. Any other output is
content, released as it comes.
"""

from deployments.parsers.tool_calls import ToolCall, ToolCallFormat


class LeadingCallsFormat(ToolCallFormat):
    leading: tuple[str, ...] = ()  # how an output of calls begins

    def parse_all(self, text: str) -> list[ToolCall] | None:
        """The calls a whole output (that begins with an opening) holds; None when it is not calls."""
        raise NotImplementedError


class LeadingCallsParser:
    def __init__(self, tool_format: LeadingCallsFormat):
        self.format = tool_format
        self._pending = ""
        self._holding: bool | None = None  # undecided until the output's start shows whether it opens calls
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Consume a chunk; returns (content delta, tool calls completed in it): none until the end."""
        if self._holding is False:
            return text, []
        self._pending += text
        start = self._pending.lstrip()
        if not start or any(opening.startswith(start) for opening in self.format.leading):
            return "", []  # too short to tell
        self._holding = start.startswith(self.format.leading)
        if self._holding:
            return "", []
        content, self._pending = self._pending, ""
        return content, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        pending, self._pending = self._pending, ""
        calls = self.format.parse_all(pending.strip()) if self._holding else None
        if calls is None:
            return pending, []
        self.calls += calls
        return "", calls
