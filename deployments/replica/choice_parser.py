"""Turns one choice's stream of text into reasoning, content and tool-call deltas."""

from dataclasses import dataclass, field

from deployments.parsers import ReasoningParser, ToolCall, ToolCallFormat, tool_call_parser
from deployments.parsers.harmony import HarmonyParser
from deployments.parsers.reasoning import END


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChoiceParser:
    """Feed each delta's text; the parsers hold back partial tags until they resolve."""

    def __init__(self, reasoning: ReasoningParser | None, tool_format: ToolCallFormat | None, tokenizer,
                 parallel_tool_calls: bool = True):
        self.reasoning = reasoning
        self.tools = tool_call_parser(tool_format) if tool_format else None
        self.max_calls = None if parallel_tool_calls else 1  # OpenAI's parallel_tool_calls false: the first call
        self.calls_given = 0
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.reasoning_tokens = 0  # known after the final feed

    def feed(self, text: str, token_ids: list[int], final: bool) -> ChoiceDelta:
        """`token_ids` produced `text`; on the last call, everything held is released."""
        delta = ChoiceDelta()
        if self.reasoning is not None:
            self.token_ids += token_ids
            delta.reasoning, delta.content = self.reasoning.feed(text)
            if final:
                reasoning, content = self.reasoning.finish()
                delta.reasoning += reasoning
                delta.content += content
                self.reasoning_tokens = self._count_reasoning_tokens()
        else:
            delta.content = text
        if self.tools is not None:
            delta.content, delta.tool_calls = self.tools.feed(delta.content)
            if final:
                rest, partial = self.tools.finish()
                delta.content += rest
                delta.tool_calls += partial
            if self.max_calls is not None:
                delta.tool_calls = delta.tool_calls[: max(0, self.max_calls - self.calls_given)]
            self.calls_given += len(delta.tool_calls)
        return delta

    def _count_reasoning_tokens(self) -> int:
        """The output tokens up to the one that closed the reasoning block, tags included (all of them when the
        output ended inside the block). Found on the token ids, so it does not depend on how the text was split
        into deltas: the shortest prefix whose text holds the closing tag."""
        if not self.reasoning.had_block:
            return 0
        if self.reasoning.in_reasoning:
            return len(self.token_ids)
        low, high = 1, len(self.token_ids)
        while low < high:
            middle = (low + high) // 2
            if END in self.tokenizer.decode(self.token_ids[:middle], skip_special_tokens=False):
                high = middle
            else:
                low = middle + 1
        return low

    @property
    def made_tool_calls(self) -> bool:
        return bool(self.tools and self.tools.calls)


class HarmonyChoiceParser:
    """gpt-oss: harmony's parser reads the token ids (the text is not used); reasoning joins the content when the
    request does not keep it separate. Tool calls are surfaced whenever the model makes one."""

    def __init__(self, separate_reasoning: bool):
        self.harmony = HarmonyParser()
        self.separate_reasoning = separate_reasoning

    def feed(self, text: str, token_ids: list[int], final: bool) -> ChoiceDelta:
        reasoning, content, calls = self.harmony.feed(token_ids)
        if final:
            content += self.harmony.finish()
        if not self.separate_reasoning:
            reasoning, content = "", reasoning + content
        return ChoiceDelta(reasoning, content, calls)

    @property
    def reasoning_tokens(self) -> int:
        return self.harmony.reasoning_tokens if self.separate_reasoning else 0

    @property
    def made_tool_calls(self) -> bool:
        return bool(self.harmony.calls)


def tool_call_json(index: int, call: ToolCall) -> dict:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}
