"""Tool calls in generated text, in whichever format the model's family writes them (`tool_formats.py`).

Text outside the calls is content. While streaming, content is released as
it comes (minus a tail that could open a call), and each call is released
whole once its closing tag arrives, so a partial tag never leaks. An output
that ends inside a call (cut by max_tokens) ends with the call as far as it
got, never with its raw markup as content. Formats that wrap their calls in a
section (DeepSeek's, Kimi's, MiniMax's) have only markup between the calls
inside it: dropped; so is whitespace between calls (or after the last) where
there is no section.
"""

import uuid
from dataclasses import dataclass, field
from enum import Enum

from deployments.parsers.tag_stream import split_at_first


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


class ToolCallFormat:
    """How one family writes its calls. `schemas` are the request's tools' parameter schemas by name (formats that
    write arguments as text read each value by its type)."""

    special_tokens = False  # its tags are special tokens: decoded only with skip_special_tokens off

    def __init__(self, schemas: dict[str, dict | None]):
        self.schemas = schemas


class TaggedFormat(ToolCallFormat):
    """Calls between tags (and all of them in a section, where the family has one: `sections` are the (open,
    close) pairs it may write), and how a call's body reads."""

    sections: tuple[tuple[str, str], ...] = ()
    call: tuple[str, str] = ("<tool_call>", "</tool_call>")

    def parse(self, body: str) -> ToolCall:
        """A whole call's body (by default, read as a partial one that got to its end); a malformed one is
        surfaced (no name, its text as the arguments), not dropped."""
        call = self.parse_partial(body)
        if call is None or not call.name:
            return self.malformed(body)
        call.arguments = call.arguments or "{}"
        return call

    def parse_partial(self, body: str) -> ToolCall | None:
        """The call an unclosed body began: its name and arguments as far as they got; None before its name is
        whole."""
        raise NotImplementedError

    @staticmethod
    def malformed(body: str) -> ToolCall:
        return ToolCall(name="", arguments=body.strip())


class _Where(Enum):
    OUTSIDE = 0  # content
    SECTION = 1  # between calls, inside a section
    CALL = 2  # inside a call


class ToolCallParser:
    def __init__(self, tool_format: TaggedFormat):
        self.format = tool_format
        self._pending = ""
        self._where = _Where.OUTSIDE
        self._after_call = False  # the last thing written was a call: whitespace after it waits to see what follows
        self.calls: list[ToolCall] = []

    def _tags(self) -> tuple[str, ...]:
        sections, call = self.format.sections, self.format.call
        if self._where is _Where.CALL:
            return (call[1],)
        if self._where is _Where.SECTION:
            return call[0], *(close for _, close in sections)
        return tuple(open_ for open_, _ in sections) or (call[0],)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Consume a chunk; returns (content delta, tool calls completed in it)."""
        self._pending += text
        content, calls = "", []
        while self._pending:
            before, tag, after, held = split_at_first(self._pending, self._tags())
            if self._where is _Where.OUTSIDE:
                if not self._after_call or before.strip():
                    content += before
                    self._after_call = False
                elif tag is None:
                    break  # whitespace after a call, held: dropped if a call or the end follows, kept before text
            if tag is None:
                if self._where is not _Where.CALL:  # a call's body waits whole for its end
                    self._pending = held
                break
            if self._where is _Where.CALL:
                calls.append(self.format.parse(before))
                self._where = _Where.SECTION if self.format.sections else _Where.OUTSIDE
                self._after_call = True
            elif tag == self.format.call[0]:
                self._where = _Where.CALL
            else:  # a section opens or closes
                self._where = _Where.SECTION if self._where is _Where.OUTSIDE else _Where.OUTSIDE
            self._pending = after
        self.calls += calls
        return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left at the end: held text as content (whitespace after the last call dropped); an unclosed call
        as the call it began."""
        pending, self._pending = self._pending, ""
        if self._where is not _Where.CALL:
            kept = self._where is _Where.OUTSIDE and not (self._after_call and not pending.strip())
            return (pending if kept else ""), []
        call = self.format.parse_partial(pending)
        self.calls += [call] if call else []
        return "", [call] if call else []
