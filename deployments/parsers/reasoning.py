"""Reasoning parsers: `<think>…</think>` goes to `reasoning_content`, the rest to `content`.

`qwen3` (and the families that write their blocks the same way) expects the
model to open the block itself, unless the prompt already opened it (a
thinking-only template's generation prompt ends in `<think>`); `deepseek-r1`
starts inside the block, as its template opens it in the prompt, unless the
prompt closed it (thinking switched off). Either way a block the template
closed in the prompt means the output is all content. A response cut short
inside the block is all reasoning.
"""

from deployments.parsers.tag_stream import split_at

START, END = "<think>", "</think>"


class ReasoningParser:
    def __init__(self, starts_in_reasoning: bool):
        self._state = "reasoning_start" if starts_in_reasoning else "start"
        self._pending = ""
        self.had_block = starts_in_reasoning  # the output opened (or starts inside) a reasoning block

    @property
    def in_reasoning(self) -> bool:
        return self._state in ("reasoning_start", "reasoning")

    def feed(self, text: str) -> tuple[str, str]:
        """Consume a chunk of output; returns (reasoning delta, content delta)."""
        self._pending += text
        reasoning, content = "", ""
        while self._pending:
            if self._state == "start":  # an opening tag, possibly after whitespace, or plain content
                stripped = self._pending.lstrip()
                if not stripped or (START.startswith(stripped) and stripped != START):
                    break  # could still become the opening tag
                if stripped.startswith(START):
                    self._pending, self._state = stripped[len(START) :], "reasoning_start"
                    self.had_block = True
                else:
                    self._state = "content"  # no reasoning block: the text is content, untouched
            elif self._state in ("reasoning_start", "content_start"):
                stripped = self._pending.lstrip()  # the newlines around the tags are not part of either
                if not stripped:
                    self._pending = ""
                    break
                self._pending = stripped
                self._state = "reasoning" if self._state == "reasoning_start" else "content"
            elif self._state == "reasoning":
                before, after, held = split_at(self._pending, END)
                reasoning += before
                if after is None:
                    self._pending = held
                    break
                self._pending, self._state = after, "content_start"
            else:
                content += self._pending
                self._pending = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Release whatever is held back at the end of the output."""
        pending, self._pending = self._pending, ""
        if self.in_reasoning:
            return pending, ""
        return "", pending


def model_opens_the_block(prompt_tail: str) -> ReasoningParser:
    return ReasoningParser(starts_in_reasoning=prompt_tail.rstrip().endswith(START))


def prompt_opens_the_block(prompt_tail: str) -> ReasoningParser:
    return ReasoningParser(starts_in_reasoning=not prompt_tail.rstrip().endswith(END))


# by the names `reasoning_parser` takes (vLLM's), each given the end of the prompt's text
REASONING_PARSERS = {
    "qwen3": model_opens_the_block, "glm45": model_opens_the_block, "kimi_k2": model_opens_the_block,
    "minimax_m2": model_opens_the_block, "deepseek_v3": model_opens_the_block,
    "deepseek-r1": prompt_opens_the_block, "deepseek_r1": prompt_opens_the_block,
}
