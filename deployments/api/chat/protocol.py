"""/v1/chat/completions' request body: the conversation, its tools and how they may be called, beside the
shared sampling fields."""

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from deployments.api.request_model import RequestModel
from deployments.api.sampling_fields import SamplingFields, bound_logprobs
from deployments.api.tool_schema import tool_call_schema
from runtime import SamplingParams
from runtime.text.grammar import Constraint


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ImageURL(RequestModel):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the model's processor decides the resolution


class ImagePart(RequestModel):
    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _url_alone(cls, v):
        return {"url": v} if isinstance(v, str) else v  # some clients send the URL bare


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionDefinition(RequestModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionName


class ChatMessage(RequestModel):
    role: str = Field(min_length=1)  # the chat template decides what a role means (custom roles pass through)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    # an earlier assistant turn's reasoning, echoed back (vLLM's newer name is `reasoning`): the chat template
    # decides whether it is rendered (Qwen3's, Kimi's and MiniMax's keep it within a tool-calling turn)
    reasoning_content: str | None = Field(None, validation_alias=AliasChoices("reasoning_content", "reasoning"))

    def template_dict(self, as_parts: bool = False) -> dict:
        """The message as the chat template expects it: plain-text content, or for a model that takes images
        (`as_parts`) a list of parts, `{"type": "text", "text": ...}` and `{"type": "image"}` where a picture goes,
        as transformers' processors' templates read them."""
        out = self.model_dump(exclude_none=True)
        if as_parts:
            parts = self.content if isinstance(self.content, list) else [TextPart(type="text", text=self.content)] \
                if self.content else []
            out["content"] = [{"type": "image"} if isinstance(p, ImagePart) else {"type": "text", "text": p.text}
                              for p in parts]
        elif isinstance(self.content, list):
            out["content"] = "".join(part.text for part in self.content if isinstance(part, TextPart))
        out.setdefault("content", "")
        return out


def image_urls(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """The pictures a conversation names, in order: (url, the field that names it)."""
    return [(part.image_url.url, f"messages[{i}].content[{j}].image_url")
            for i, m in enumerate(messages) if isinstance(m.content, list)
            for j, part in enumerate(m.content) if isinstance(part, ImagePart)]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    separate_reasoning: bool = True
    # OpenAI's values; gpt-oss (harmony) takes low, medium and high, other models ignore it
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice = "auto"
    parallel_tool_calls: bool = True
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_request_template(cls, v):
        if v and "chat_template" in v:  # a client's Jinja would run on the replica: unbounded work
            raise ValueError("chat_template: request-supplied chat templates are not accepted; the model's is used")
        return v

    @model_validator(mode="after")
    def _bounded_logprobs(self):
        limit = self.max_completion_tokens or self.max_tokens
        if self.logprobs and limit:
            bound_logprobs(self.n * limit * (1 + (self.top_logprobs or 0)), "n x max_tokens x (1 + top_logprobs)",
                            self.stream)
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, not one of the tools {names}")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def tool_constraint(self) -> Constraint | None:
        """`required` and named tool choices are enforced by a grammar over the call."""
        if not self.uses_tools or self.tool_choice == "auto":
            return None
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
        return Constraint("tool_call", tool_call_schema([(t.function.name, t.function.parameters) for t in tools]),
                          "tool_choice")

    def to_sampling_params(self) -> SamplingParams:
        top = self.top_logprobs or 0
        # a forced call makes no text, so a text format has nothing to constrain: the call's grammar wins (as
        # OpenAI accepts both; instructor's RESPONSES_TOOLS mode sends both)
        constraint = self.tool_constraint() or self.constraint()
        return self.sampling_params(self.max_completion_tokens or self.max_tokens, top if self.logprobs else None,
                                    constraint, prompt_logprobs=self.prompt_logprobs)
