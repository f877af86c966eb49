"""The body of POST /v1/messages, and the chat completion request it becomes.

Content blocks map onto chat messages: `text` blocks join into the turn's text, an assistant's `tool_use`
blocks become its `tool_calls`, a user's `tool_result` blocks become `tool` messages (before the user's own
text, as they answer the calls of the turn before), echoed `thinking` blocks become the turn's
`reasoning_content` (the chat template decides whether past reasoning is rendered). `thinking` switches the
template's `enable_thinking`; `tool_choice` any/tool/none become required/named/none. A last assistant turn of
text is where the reply starts (Anthropic's prefill): the model goes on writing it, and the reply holds only
what it adds. `cache_control` marks (on tools, system blocks and content blocks) end the prefix whose tokens the
usage counts as written to the cache (`cached_prefix_messages`); the prefix cache itself keeps every full block,
marked or not.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.request_model import RequestModel


class CacheControl(RequestModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        return f"Error: {text}" if self.is_error else text


class ImageSource(RequestModel):
    type: Literal["base64", "url"]
    media_type: str | None = None  # with base64: image/png, image/jpeg, image/gif, image/webp
    data: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _has_its_field(self):
        if (self.type == "base64") != (self.data is not None) or (self.type == "url") != (self.url is not None):
            raise ValueError("a base64 source takes media_type and data; a url source takes url")
        return self

    def as_url(self) -> str:
        """The picture as a chat image_url: a data: URL, or the URL as sent."""
        return f"data:{self.media_type or 'image/png'};base64,{self.data}" if self.type == "base64" else self.url


class ImageBlock(RequestModel):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = None


class ThinkingBlock(RequestModel):
    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""  # a redacted block has none


def _block_kind(block: Any) -> str:
    return block.get("type", "") if isinstance(block, dict) else getattr(block, "type", "")


_BLOCK_KINDS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[ThinkingBlock, Tag("redacted_thinking")],
    Discriminator(_block_kind)]


class Message(RequestModel):
    # a system turn inside the conversation, as Claude Code sends (its text blocks; rendered where it stands)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _pictures_in_user_turns(self):
        if self.role == "system" and any(isinstance(b, ImageBlock) for b in self.content):
            raise ValueError("a system turn takes text blocks only, not images")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, v):
        for block in v if isinstance(v, list) else []:
            if _block_kind(block) not in _BLOCK_KINDS:
                raise ValueError(f"content blocks of type {str(_block_kind(block))[:40]!r} are not supported "
                                 f"({', '.join(_BLOCK_KINDS)} are)")
        return v

    def chat_messages(self) -> list[dict]:
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        text = "".join(b.text for b in self.content if isinstance(b, TextBlock))
        if self.role == "system":
            return [{"role": "system", "content": text}]
        results = [{"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
                   for b in self.content if isinstance(b, ToolResultBlock)]
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in self.content if isinstance(b, ToolUseBlock)]
        own = {"role": self.role, "content": text if text or not calls else None}
        pictured = any(isinstance(b, ImageBlock) for b in self.content)
        if pictured:  # text and pictures in the order sent
            own["content"] = [{"type": "image_url", "image_url": {"url": b.source.as_url()}}
                              if isinstance(b, ImageBlock) else {"type": "text", "text": b.text}
                              for b in self.content if isinstance(b, (TextBlock, ImageBlock))]
        if calls:
            own["tool_calls"] = calls
        reasoning = "".join(b.thinking for b in self.content if isinstance(b, ThinkingBlock))
        if reasoning and self.role == "assistant":
            own["reasoning_content"] = reasoning
        return results + ([own] if text or pictured or calls or not results else [])


class AnthropicTool(RequestModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict
    cache_control: CacheControl | None = None


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)  # accepted, not enforced: the model thinks within max_tokens


class CountTokensRequest(RequestModel):
    """What /v1/messages/count_tokens counts: the prompt a Messages request would render."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    # our extensions, as the chat route has them (through the SDK's extra_body)
    seed: int | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # vLLM's, as on the chat route

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        """As Anthropic's: a forced tool is one of the tools given."""
        choice, names = self.tool_choice, [t.name for t in self.tools or []]
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f"tool_choice {choice.type!r} needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names {str(choice.name)[:64]!r}, not one of the tools {names[:8]}")
        return self

    def system_text(self) -> str | None:
        return self.system if isinstance(self.system, str) or self.system is None else \
            "".join(b.text for b in self.system)

    def chat_messages(self) -> list[dict]:
        system = self.system_text()
        return [{"role": "system", "content": system}] * bool(system) + \
            [m for message in self.messages for m in message.chat_messages()]

    def cached_prefix_messages(self) -> list[dict] | None:
        """The chat messages up to the last `cache_control` mark, in Anthropic's order (tools, system, messages):
        the conversation cut after the marked block, or the system turn alone for a mark on the system or a tool
        (templates render tools within it); None without marks."""
        for i in range(len(self.messages) - 1, -1, -1):
            blocks = self.messages[i].content
            marked = [j for j, b in enumerate(blocks if isinstance(blocks, list) else [])
                      if getattr(b, "cache_control", None) is not None]
            if marked:
                cut = Message(role=self.messages[i].role, content=blocks[:marked[-1] + 1])
                return CountTokensRequest.model_construct(
                    system=self.system, messages=[*self.messages[:i], cut]).chat_messages()
        system = self.system if isinstance(self.system, list) else []
        if any(b.cache_control for b in system) or any(t.cache_control for t in self.tools or []):
            return [{"role": "system", "content": self.system_text() or ""}]
        return None

    def cache_ttl_s(self) -> float:
        """How long the prefix up to the last mark stays cached in preference: an hour when a mark says `1h`,
        else five minutes (Anthropic's default)."""
        system = self.system if isinstance(self.system, list) else []
        blocks = [*(self.tools or []), *system, *(b for m in self.messages if isinstance(m.content, list)
                                                 for b in m.content)]
        marks = [getattr(b, "cache_control", None) for b in blocks]
        return 3600.0 if any(m is not None and m.ttl == "1h" for m in marks) else 300.0

    def to_chat(self) -> ChatCompletionRequest:
        messages = self.chat_messages()
        prefill = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
        chat: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                                "stream": self.stream, "continue_final_message": prefill}
        if self.stream:  # usage on every chunk: message_start carries the input tokens
            chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        for name in ("temperature", "top_p", "top_k", "seed", "ignore_eos", "regex", "ebnf", "cache_salt"):
            if getattr(self, name) is not None:
                chat[name] = getattr(self, name)
        if self.stop_sequences:
            chat["stop"] = self.stop_sequences
        if self.thinking is not None:
            chat["chat_template_kwargs"] = {"enable_thinking": self.thinking.type != "disabled"}
        if self.tools:
            chat["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema}} for t in self.tools]
            choice = self.tool_choice
            if choice is not None:
                chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
                    {"type": "function", "function": {"name": choice.name or ""}}
                chat["parallel_tool_calls"] = not choice.disable_parallel_tool_use
        return ChatCompletionRequest.model_validate(chat)


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _budget_below_max_tokens(self):
        """As Anthropic's: a thinking budget leaves room for the answer within max_tokens."""
        budget = self.thinking.budget_tokens if self.thinking and self.thinking.type == "enabled" else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({self.max_tokens})")
        return self


# The chat request's fields, as the Messages request names them (an error's param)
CHAT_NAMES = {"stop": "stop_sequences", "chat_template_kwargs": "thinking"}
