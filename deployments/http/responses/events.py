"""A chat completion stream as the Responses API's event sequence.

`response.created` and `response.in_progress`; then per output item
`output_item.added`, its content part's `added`, the deltas
(`reasoning_text.delta`, `output_text.delta`, `function_call_arguments.delta`),
their `done` events and `output_item.done`; then `response.completed`, whose
response says `incomplete` when the token limit cut it (as vLLM and SGLang
send it: the SDK's stream helper and the agents SDK wait for
`response.completed` and never see a `response.incomplete`). Every event carries its
`sequence_number`; the HTTP edge frames each as an SSE `event:` + `data:` pair.
"""

from deployments.api.format import now
from deployments.api.ids import new_id
from deployments.api.responses.protocol import ResponsesRequest
from deployments.http.responses.output import (
    function_call_item,
    message_item,
    reasoning_item,
    response_object,
    response_usage,
    status_of,
    text_part,
)


class ResponseEvents:
    def __init__(self, req: ResponsesRequest, response_id: str, model: str):
        self.req = req
        self.response_id = response_id
        self.created_at = now()  # once: every event's response, and the stored one, carry the same
        self.model = model
        self.sequence = 0
        self.output: list[dict] = []  # finished items
        self.open: dict | None = None  # the reasoning or message item whose text is streaming
        self.text = ""
        self.logprobs: list[dict] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        # held until text follows, as the non-streamed reply has them: whitespace between tool calls (which
        # makes no message item), and the logprobs of chunks whose text a parser held back
        self.held_space = ""
        self.held_logprobs: list[dict] = []

    def event(self, kind: str, **fields) -> dict:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return payload

    def start(self) -> list[dict]:
        response = self.response("in_progress")
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def feed(self, chunk: dict) -> list[dict]:
        """The events of one chat completion chunk (choice 0; a response has one)."""
        if chunk.get("usage"):
            self.usage = response_usage(chunk["usage"])
        events = []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            self.held_logprobs += (choice.get("logprobs") or {}).get("content") or []
            if delta.get("reasoning_content"):
                events += self._text("reasoning", delta["reasoning_content"])
            content = delta.get("content")
            if content and not content.strip() and (self.open is None or self.open["type"] != "message"):
                self.held_space += content
            elif content:
                events += self._text("message", self.held_space + content)
                self.held_space = ""
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return events

    def close(self) -> list[dict]:
        """The events that finish the output items."""
        events = []
        replied = any(item["type"] in ("message", "function_call") for item in self.output)
        if not replied and (self.open is None or self.open["type"] != "message"):
            # no message and no call: one message (empty, or the whitespace held), as the non-streamed reply has
            events = self._text("message", self.held_space) if self.held_space else self._close() + \
                self._open("message")
        return events + self._close(status_of(self.finish_reason))

    def final(self) -> dict:
        """The finished response (after `close`), for `response.completed`."""
        return self.response(status_of(self.finish_reason), self.usage)

    def fail(self, error: dict) -> list[dict]:
        """`error` (OpenAI's error object) ends the stream: an `error` event, then `response.failed`."""
        failed = self.response("failed", error={"code": "server_error", "message": error["message"]})
        return [self.event("error", code=error.get("code") or error.get("type"), message=error["message"],
                           param=error.get("param")),
                self.event("response.failed", response=failed)]

    def response(self, status: str, usage: dict | None = None, error: dict | None = None) -> dict:
        return response_object(self.req, self.response_id, self.created_at, self.model, status, list(self.output),
                               usage, error)

    # --- items ------------------------------------------------------------------------

    def _text(self, kind: str, text: str) -> list[dict]:
        events = [] if self.open is not None and self.open["type"] == kind else self._close() + self._open(kind)
        self.text += text
        where = {"item_id": self.open["id"], "output_index": len(self.output), "content_index": 0}
        if kind == "reasoning":
            return events + [self.event("response.reasoning_text.delta", **where, delta=text)]
        logprobs, self.held_logprobs = self.held_logprobs, []
        self.logprobs += logprobs
        return events + [self.event("response.output_text.delta", **where, delta=text, logprobs=logprobs)]

    def _open(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            self.open, part = reasoning_item(new_id("rs_"), "", "in_progress"), {"type": "reasoning_text", "text": ""}
        else:
            self.open, part = message_item(new_id("msg_"), None, None, "in_progress"), text_part("", None)
        self.text, self.logprobs = "", []
        index = len(self.output)
        return [self.event("response.output_item.added", output_index=index, item=self.open),
                self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                           content_index=0, part=part)]

    def _close(self, status: str = "completed") -> list[dict]:
        """The open item's done events; `status` is `incomplete` for the item the token limit cut."""
        if self.open is None:
            return []
        item_id, index, text = self.open["id"], len(self.output), self.text
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if self.open["type"] == "reasoning":
            item, part = reasoning_item(item_id, text, status), {"type": "reasoning_text", "text": text}
            events = [self.event("response.reasoning_text.done", **where, text=text)]
        else:
            self.logprobs += self.held_logprobs  # a parser's held-back tail: its tokens are this text's
            self.held_logprobs = []
            item, part = message_item(item_id, text, self.logprobs, status), text_part(text, self.logprobs)
            events = [self.event("response.output_text.done", **where, text=text, logprobs=self.logprobs)]
        events += [self.event("response.content_part.done", **where, part=part),
                   self.event("response.output_item.done", output_index=index, item=item)]
        self.output.append(item)
        self.open = None
        return events

    def _call(self, call: dict) -> list[dict]:
        self.held_space = ""
        events = self._close()
        item = function_call_item(new_id("fc_"), call, self.req.tool_names)
        index, arguments = len(self.output), item["arguments"]
        where = {"item_id": item["id"], "output_index": index}
        events += [self.event("response.output_item.added", output_index=index,
                              item={**item, "arguments": "", "status": "in_progress"}),
                   self.event("response.function_call_arguments.delta", **where, delta=arguments),
                   self.event("response.function_call_arguments.done", **where, name=item["name"],
                              arguments=arguments),
                   self.event("response.output_item.done", output_index=index, item=item)]
        self.output.append(item)
        return events
