"""POST /v1/messages and /v1/messages/count_tokens: a chat completion underneath, shaped as Anthropic's message.

A stream is Anthropic's event sequence over the typed chat chunks: `message_start`, `ping`, per content block
`content_block_start`, its deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`, then `message_delta` (stop reason, the final usage) and `message_stop`; an error after
the start is an `error` event. Errors are in Anthropic's shape: `{"type": "error", "error": {type, message}}`.
"""

import json
from collections.abc import AsyncIterator

from pydantic import ValidationError

from deployments.api.anthropic.protocol import CHAT_NAMES, CountTokensRequest, MessagesRequest
from deployments.api.ids import new_id
from deployments.api.tokenize.protocol import TokenizeRequest
from deployments.clients import ModelClient
from deployments.errors import OpenAIError, StreamError, from_validation_error

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


def anthropic_error_of(e: OpenAIError) -> dict:
    """An error in Anthropic's shape; one over the context in Anthropic's words, which its clients parse: Claude
    Code lowers max_tokens and retries on the first, and compacts the conversation on the second."""
    if e.overflow is not None:
        prompt, max_tokens, limit = e.overflow
        if max_tokens is None or prompt >= limit:
            return anthropic_error(e.status, f"prompt is too long: {prompt} tokens > {limit} maximum")
        return anthropic_error(e.status, f"input length and `max_tokens` exceed context limit: {prompt} + "
                                         f"{max_tokens} > {limit}, decrease input length or `max_tokens` and try again")
    return anthropic_error(e.status, e.message)


def chat_request(req: CountTokensRequest):
    """The chat completion request of a Messages request; a bad value names the Messages field."""
    try:
        return req.to_chat()
    except ValidationError as e:
        error = from_validation_error(e)
        head = (error.param or "").split(".")[0]
        param = CHAT_NAMES.get(head, head) + (error.param or "")[len(head):] if error.param else None
        raise OpenAIError(400, error.message, param) from None


def stop_reason(finish_reason: str | None, matched_stop, req: MessagesRequest) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat choice's finish."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls":
        return "tool_use", None
    if isinstance(matched_stop, str) and matched_stop in (req.stop_sequences or []):
        return "stop_sequence", matched_stop
    return "end_turn", None


def usage(chat_usage: dict | None, breakpoint: int = 0) -> dict:
    """Anthropic's usage: the prompt's tokens read from a cache (any tier), those up to the last `cache_control`
    mark (`breakpoint`) that were not and so were written, and the rest as input tokens. The prefix cache keeps
    whole blocks: the part of a block the mark cuts is written again on each request."""
    chat_usage = chat_usage or {"prompt_tokens": 0, "completion_tokens": 0}
    prompt = chat_usage["prompt_tokens"]
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    written = max(0, min(breakpoint, prompt) - cached)
    return {"input_tokens": prompt - cached - written, "output_tokens": chat_usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": written}


async def cache_breakpoint(req: CountTokensRequest, chat, model: ModelClient) -> int:
    """The prompt's tokens up to its last `cache_control` mark; 0 without marks, or where the chat template
    cannot render the cut conversation alone (the accounting then counts nothing as written). The chat request
    pins them, for the marks' TTL: the pool keeps their blocks in preference (`runtime/core/free_blocks.py`)."""
    messages = req.cached_prefix_messages()
    if messages is None:
        return 0
    try:
        counted = await model.tokenize(TokenizeRequest(model=req.model, messages=messages, tools=chat.tools,
                                                       chat_template_kwargs=chat.chat_template_kwargs,
                                                       add_generation_prompt=False))
    except OpenAIError:
        return 0
    chat.pin_prefix_tokens, chat.pin_ttl_s = counted["count"], req.cache_ttl_s()
    return counted["count"]


def _tool_use(call: dict) -> dict:
    """A chat tool call as a tool_use block; a call cut by max_tokens keeps the arguments that are whole JSON
    (none, when they were cut: `input` is an object, not text)."""
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call.get("id") or new_id("toolu_"), "name": call["function"]["name"],
            "input": arguments if isinstance(arguments, dict) else {}}


class AnthropicMessages:
    async def create(self, req: MessagesRequest, model: ModelClient, model_id: str, owner: str | None) -> dict:
        chat = chat_request(req)
        # one call after the other: two calls one request makes at once to a deployment share its request id
        # in Serve, and the second never reached the replica
        breakpoint = await cache_breakpoint(req, chat, model)
        completion = await model.chat(chat, owner=owner)
        choice = completion["choices"][0]
        message = choice["message"]
        content = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        content += [_tool_use(call) for call in message.get("tool_calls") or []]
        reason, sequence = stop_reason(choice["finish_reason"], choice.get("matched_stop"), req)
        return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": model_id, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage(completion["usage"], breakpoint)}

    async def stream(self, req: MessagesRequest, model: ModelClient, model_id: str,
                     owner: str | None) -> AsyncIterator[dict]:
        """The events (dicts, framed at the edge); an error before the model's first chunk raises first."""
        chat = chat_request(req)
        events = _MessageEvents(req, model_id, await cache_breakpoint(req, chat, model))
        async for chunk in model.chat_stream(chat, owner):
            if isinstance(chunk, StreamError):
                yield {"type": "error", **anthropic_error(chunk.status, chunk.message)}
                return
            for event in events.feed(chunk):
                yield event
        for event in events.close():
            yield event

    async def count_tokens(self, req: CountTokensRequest, model: ModelClient) -> dict:
        chat = chat_request(req)
        counted = await model.tokenize(TokenizeRequest(model=req.model, messages=chat.messages, tools=chat.tools,
                                                       chat_template_kwargs=chat.chat_template_kwargs,
                                                       continue_final_message=chat.continue_final_message))
        return {"input_tokens": counted["count"]}


class _MessageEvents:
    """Anthropic's stream events from the chat chunks of choice 0."""

    def __init__(self, req: MessagesRequest, model_id: str, breakpoint: int):
        self.req = req
        self.model_id = model_id
        self.breakpoint = breakpoint
        self.started = False
        self.block: str | None = None  # the open block's kind: thinking, text or tool_use
        self.index = -1
        self.finish: tuple[str | None, object] = (None, None)
        self.usage: dict | None = None

    def feed(self, chunk: dict) -> list[dict]:
        self.usage = chunk.get("usage") or self.usage
        events = [] if self.started else self._start()
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                events += self._delta("thinking", {"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                events += self._delta("text", {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                events += self._open("tool_use", {"id": call.get("id") or new_id("toolu_"),
                                                  "name": call["function"]["name"], "input": {}})
                events.append(self._event("content_block_delta", index=self.index, delta={
                    "type": "input_json_delta", "partial_json": call["function"]["arguments"]}))
            if choice.get("finish_reason"):
                self.finish = (choice["finish_reason"], choice.get("matched_stop"))
        return events

    def close(self) -> list[dict]:
        events = [] if self.started else self._start()
        events += self._close()
        reason, sequence = stop_reason(*self.finish, self.req)
        # the whole usage, as Anthropic's message_delta carries it (LangChain reads the input tokens from it)
        return events + [self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                                     usage=usage(self.usage, self.breakpoint)),
                         self._event("message_stop")]

    def _start(self) -> list[dict]:
        self.started = True
        message = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": self.model_id,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {**usage(self.usage, self.breakpoint), "output_tokens": 0}}
        return [self._event("message_start", message=message), self._event("ping")]

    def _delta(self, kind: str, delta: dict) -> list[dict]:
        events = [] if self.block == kind else self._open(kind, {"thinking": "", "signature": ""}
                                                          if kind == "thinking" else {"text": ""})
        return events + [self._event("content_block_delta", index=self.index, delta=delta)]

    def _open(self, kind: str, fields: dict) -> list[dict]:
        events = self._close()
        self.block, self.index = kind, self.index + 1
        return events + [self._event("content_block_start", index=self.index,
                                     content_block={"type": kind, **fields})]

    def _close(self) -> list[dict]:
        if self.block is None:
            return []
        self.block = None
        return [self._event("content_block_stop", index=self.index)]

    @staticmethod
    def _event(kind: str, **fields) -> dict:
        return {"type": kind, **fields}
