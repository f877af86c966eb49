"""The body of POST /v1/responses, and how it becomes a chat completion request.

A response is a chat completion underneath: `instructions` become the system
message, the input items (and the stored conversation that
`previous_response_id` or `conversation` names) become the messages, `text.format` becomes a
response format, function tools (flat or in namespaces: tools.py) become chat
tools. Our sampling
extensions (`top_k`, `seed`, `ebnf`, ...) are accepted here as on the chat
route.
"""

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.ids import new_id
from deployments.api.request_model import RequestModel
from deployments.api.responses.tools import HostedTool, NamedFunction, ResponsesTool, ToolNames, forced_hosted_tool
from deployments.api.sampling_fields import SamplingFields

# Fields passed to the chat request as they are (the rest are Responses' own, mapped in `to_chat`)
_SAMPLING = set(SamplingFields.model_fields) - {"n", "stream_options", "response_format", "user"}


class TextPart(RequestModel):
    """`input_text` in a user turn; `output_text` (or `refusal`) in an assistant turn echoed back."""

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str = ""


class ImagePart(RequestModel):
    """`input_image` in a user turn, by URL (data:, or http(s) and s3:// where the server allows them), or by the
    `file_id` of a picture uploaded to the Files API (read into `image_url` before the turn runs:
    `ResponsesAPI._read_files`)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None

    @model_validator(mode="after")
    def _by_url_or_file(self):
        if (self.image_url is None) == (self.file_id is None):
            raise ValueError("input_image: send the picture as image_url (a data: URL, or a URL the server may "
                             "read) or as the file_id of an upload, one of them")
        return self


def _part_kind(part: Any) -> str:
    return part.get("type", "") if isinstance(part, dict) else getattr(part, "type", "")


Part = Annotated[Annotated[TextPart, Tag("text")] | Annotated[ImagePart, Tag("input_image")],
                 Discriminator(lambda p: "input_image" if _part_kind(p) == "input_image" else "text")]


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: str = Field(min_length=1)
    content: str | list[Part]

    @model_validator(mode="after")
    def _pictures_in_user_turns(self):
        if self.role in ("system", "developer") and not isinstance(self.content, str) and any(
                isinstance(p, ImagePart) for p in self.content):
            raise ValueError(f"a {self.role} message takes text only, not input_image")
        return self

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or part.refusal for part in self.content if isinstance(part, TextPart))

    def chat_content(self) -> str | list[dict]:
        """The content as a chat message's: its text, or with pictures, text and image_url parts in order."""
        if isinstance(self.content, str) or not any(isinstance(p, ImagePart) for p in self.content):
            return self.text()
        return [{"type": "image_url", "image_url": {"url": p.image_url}} if isinstance(p, ImagePart)
                else {"type": "text", "text": p.text or p.refusal} for p in self.content]


class FunctionCallItem(RequestModel):
    """A call the model made in an earlier turn, echoed back by a client that keeps its own history."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool the function is in (Codex sends it back)


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]


class ReasoningItem(RequestModel):
    """An earlier turn's reasoning, echoed back; chat templates drop past reasoning, so it is not rendered."""

    type: Literal["reasoning"]


_ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")


def _item_kind(item: Any) -> str:
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind)]


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def response_format(self) -> dict:
        if self.type != "json_schema":
            return {"type": self.type}
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema_ or {},
                                                       "strict": self.strict}}


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesStreamOptions(RequestModel):
    include_obfuscation: bool | None = None


class ConversationRef(RequestModel):
    id: str = Field(min_length=1)


class ResponsesRequest(SamplingFields):
    input: list[InputItem] = Field(min_length=1)  # a string is one user message
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    # a stored conversation (the Conversations API) this turn continues and is added to
    conversation: str | ConversationRef | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    store: bool = True
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    parallel_tool_calls: bool = True
    reasoning: dict | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    # OpenAI's values (a handful); unknown ones are ignored, and a list longer than any real one is refused
    include: list[Annotated[str, Field(max_length=128)]] | None = Field(None, max_length=32)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    background: bool = False
    stream_options: ResponsesStreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # our extension, as on the chat route

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, v):
        if isinstance(v, str):
            return [{"role": "user", "content": v}]
        for item in v if isinstance(v, list) else []:
            kind = _item_kind(item)
            if kind not in _ITEM_KINDS:
                raise ValueError(f"input items of type {str(kind)[:40]!r} are not supported ({', '.join(_ITEM_KINDS)} "
                                 "are)")
        return v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _no_forced_hosted_tool(cls, v):
        kind = forced_hosted_tool(v)
        if kind is not None:
            raise ValueError(f"forces a tool of type {kind!r}, which this server cannot run; only function tools")
        return v

    @model_validator(mode="after")
    def _one_history(self):
        if self.conversation is not None and self.previous_response_id is not None:
            raise ValueError("conversation and previous_response_id cannot both be given: a turn continues one")
        return self

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    @cached_property
    def tool_names(self) -> ToolNames:
        return ToolNames(self.tools or [])

    def ignored_tools(self) -> list[str]:
        """The hosted tools dropped, as the `x-ignored-fields` header names them."""
        return [f"tools.{t.type}" for t in self.tools or [] if isinstance(t, HostedTool)]

    @field_validator("background")
    @classmethod
    def _background_is_stored(cls, v, info: ValidationInfo):
        if v and not info.data.get("store", True):
            raise ValueError("a background response is stored (store: true), to be read back")
        return v

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or []) or bool(self.top_logprobs)

    def input_messages(self) -> list[dict]:
        """The input as chat messages (function calls join the assistant turn they follow)."""
        messages: list[dict] = []
        for item in self.input:
            if isinstance(item, MessageItem):
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": item.text() if role == "system" else item.chat_content()})
            elif isinstance(item, FunctionCallItem):
                name = self.tool_names.model_name(item.namespace, item.name)
                call = {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        return messages

    def input_items(self) -> list[dict]:
        """The input as OpenAI's input items, each with an id (what /v1/responses/{id}/input_items lists)."""
        items = []
        for item in self.input:
            if isinstance(item, MessageItem):
                kind = "output_text" if item.role == "assistant" else "input_text"
                parts = [{"type": kind, "text": item.content}] if isinstance(item.content, str) else \
                    [p.model_dump(include={"type", "file_id" if p.file_id else "image_url", "detail"})
                     if isinstance(p, ImagePart)
                     else p.model_dump(include={"type", "text"}) for p in item.content]
                if item.role == "assistant":
                    parts = [{**p, "annotations": []} for p in parts]
                items.append({"id": new_id("msg_"), "type": "message", "role": item.role, "content": parts,
                              "status": "completed"})
            elif isinstance(item, FunctionCallItem):
                items.append({"id": new_id("fc_"), **item.model_dump(include={"type", "call_id", "name", "arguments",
                                                                               "namespace"}, exclude_none=True),
                              "status": "completed"})
            elif isinstance(item, FunctionCallOutputItem):
                output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
                items.append({"id": new_id("fco_"), "type": "function_call_output", "call_id": item.call_id,
                              "output": output, "status": "completed"})
            else:
                items.append({"id": new_id("rs_"), "type": "reasoning", "summary": []})
        return items

    def to_chat(self, history: list[dict]) -> ChatCompletionRequest:
        """The chat request that generates this response, after `history` (the earlier turns' messages).
        `instructions` and the input's leading system (or developer) messages become one first system message:
        many chat templates accept a single system message, and only at the start."""
        messages = self.input_messages()
        leading = 0
        while leading < len(messages) and messages[leading]["role"] == "system":
            leading += 1
        system_texts = [self.instructions] * bool(self.instructions) + [m["content"] for m in messages[:leading]]
        system = [{"role": "system", "content": "\n\n".join(system_texts)}] if system_texts else []
        chat = {
            **self.model_dump(include=_SAMPLING, exclude_unset=True, by_alias=True),
            "messages": system + history + messages[leading:],
            "max_completion_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls,
            "stream_options": {"include_usage": True} if self.stream else None,
            "chat_template_kwargs": self.chat_template_kwargs,
            "tool_choice": self.tool_choice if isinstance(self.tool_choice, str) else {"type": "function", "function": {
                "name": self.tool_names.model_name(self.tool_choice.namespace, self.tool_choice.name)}},
        }
        if self.text is not None and self.text.format is not None:
            chat["response_format"] = self.text.format.response_format()
        if self.tool_names.functions:
            chat["tools"] = [{"type": "function", "function": {**t.model_dump(exclude={"type"}, exclude_none=True),
                                                               "name": name}} for name, t in self.tool_names.functions]
        if self.wants_logprobs:
            chat["logprobs"], chat["top_logprobs"] = True, self.top_logprobs or 0
        return ChatCompletionRequest.model_validate(chat)
