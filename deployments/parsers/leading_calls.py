"""Tool calls that run to the end of the output: formats with no closing tag (Llama's JSON, the pythonic list,
Mistral's `[TOOL_CALLS]`).

An output that begins (after whitespace) with one of the format's openings, or for a format whose calls may
follow text (`anywhere`) the output from its first opening on, is held until it ends, then read as calls; what
is not calls after all (a JSON answer, a list, a cut) is released as content. Any other text is content,
released as it comes.
"""

from deployments.parsers.tag_stream import split_at_first
from deployments.parsers.tool_calls import ToolCall, ToolCallFormat


class LeadingCallsFormat(ToolCallFormat):
    leading: tuple[str, ...] = ()  # how calls begin
    anywhere = False  # calls may follow text, not only start the output

    def parse_all(self, text: str) -> list[ToolCall] | None:
        """The calls a text that begins with an opening holds (all of it); None when it is not calls."""
        raise NotImplementedError


class LeadingCallsParser:
    def __init__(self, tool_format: LeadingCallsFormat):
        self.format = tool_format
        self._pending = ""
        self._holding: bool | None = None  # None: undecided, until the text shows whether calls begin
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Consume a chunk; returns (content delta, tool calls completed in it): none until the end."""
        if self._holding:
            self._pending += text
            return "", []
        if self._holding is False:  # the output did not begin with calls
            return text, []
        self._pending += text
        if self.format.anywhere:  # content up to the first opening (less a tail that could start one)
            before, opening, after, held = split_at_first(self._pending, self.format.leading)
            self._holding = True if opening else None
            self._pending = opening + after if opening else held
            return before, []
        start = self._pending.lstrip()
        if not start or any(opening.startswith(start) for opening in self.format.leading):
            return "", []  # too short to tell
        self._holding = start.startswith(self.format.leading)
        content, self._pending = ("", self._pending) if self._holding else (self._pending, "")
        return content, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        pending, self._pending = self._pending, ""
        calls = self.format.parse_all(pending.strip()) if self._holding else None
        if calls is None:
            return pending, []
        self.calls += calls
        return "", calls
