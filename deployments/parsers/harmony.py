"""gpt-oss output, token by token, through harmony's streaming parser.

The `analysis` channel is reasoning; `final` (and commentary addressed to no one: preambles) is content; a
message addressed to `functions.<name>` is a tool call whose text is its JSON arguments, released whole when
`<|call|>` ends it. A call cut short is returned as content, not lost. Tokens harmony refuses (output that is
not harmony) and all tokens after them are content, released at the end.
"""

from openai_harmony import HarmonyError, Role, StreamableParser, StreamState

from deployments.parsers.tool_calls import ToolCall
from runtime.text.harmony_chat import harmony_encoding


class HarmonyParser:
    def __init__(self):
        self._parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)
        self._refused: list[int] | None = None  # the output from the first token harmony refused
        self._parsed = 0  # tokens harmony took
        self.calls: list[ToolCall] = []
        self.reasoning_tokens = 0  # output tokens up to the end of the last analysis message

    def feed(self, token_ids: list[int]) -> tuple[str, str, list[ToolCall]]:
        """Consume output tokens; returns (reasoning delta, content delta, tool calls completed in them)."""
        reasoning, content, calls = "", "", []
        for token in token_ids:
            if self._refused is not None:
                self._refused.append(token)
                continue
            done = len(self._parser.messages)
            try:
                self._parser.process(token)
            except HarmonyError:
                self._refused = [token]
                continue
            self._parsed += 1
            delta = self._parser.last_content_delta
            if delta and self._parser.current_recipient is None:
                if self._parser.current_channel == "analysis":
                    reasoning += delta
                else:
                    content += delta
            for message in self._parser.messages[done:]:
                if message.channel == "analysis":
                    self.reasoning_tokens = self._parsed
                if message.recipient is not None:
                    calls.append(ToolCall(name=message.recipient.removeprefix("functions."),
                                          arguments=message.content[0].text))
        self.calls += calls
        return reasoning, content, calls

    def finish(self) -> str:
        """Content left at the end: an unfinished tool call's arguments, then any refused output."""
        content = ""
        if self._parser.state == StreamState.CONTENT:
            if self._parser.current_channel == "analysis":
                self.reasoning_tokens = self._parsed
            elif self._parser.current_recipient is not None:
                content = self._parser.current_content
        if self._refused:
            content += harmony_encoding().decode(self._refused)
        return content
