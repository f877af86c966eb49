"""POST /v1/responses and its stored responses: a chat completion underneath, shaped as a response.

The conversation a `previous_response_id` names is loaded from the store and
put before the new input; a stored response keeps that conversation plus its
own reply, so the next turn needs only its id. A turn that names a
`conversation` (the Conversations API) reads its items instead, and adds its
input and output items to it. A `background` turn returns at once and runs on
(background.py).
"""

import base64
from collections.abc import AsyncIterator, Awaitable, Callable

from pydantic import ValidationError

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.format import now
from deployments.api.ids import new_id
from deployments.api.pagination import cursor_page
from deployments.api.responses.protocol import ImagePart, MessageItem, ResponsesRequest
from deployments.batch.api import BatchAPI
from deployments.clients import ModelClient
from deployments.errors import OpenAIError, StreamError, from_validation_error
from deployments.http.conversations.handler import ConversationsAPI
from deployments.http.responses.background import BackgroundResponses
from deployments.http.responses.background_stream import BackgroundStream
from deployments.http.responses.events import ResponseEvents
from deployments.http.responses.output import output_items, response_object, response_usage, status_of, turn_messages
from deployments.http.responses.store import ResponseStore


class ResponsesAPI:
    def __init__(self, store: ResponseStore, files: BatchAPI, max_image_bytes: int,
                 conversations: ConversationsAPI, background_per_key: int):
        """`files`: the Files API, which `input_image` parts may name uploads of (at most `max_image_bytes`);
        `conversations`: where a turn that names a conversation reads it and adds itself; `background_per_key`:
        the background turns a key may run on this replica at once."""
        self.store = store
        self.background = BackgroundResponses(store, background_per_key)
        self.files = files
        self.max_image_bytes = max_image_bytes
        self.conversations = conversations

    async def create(self, req: ResponsesRequest, model: ModelClient, model_id: str, owner: str | None) -> dict:
        """The response; a background one's `queued` record, at once (`deployments/http/responses/background.py`)."""
        if req.background:
            self.background.check_room(owner)
        history, chat = await self._prepare(req, owner)
        response_id, created = new_id("resp_"), now()

        async def answer() -> dict:
            completion = await model.chat(chat, owner=owner)
            choice = completion["choices"][0]
            logprobs = (choice["logprobs"] or {}).get("content") if req.wants_logprobs else None
            output = output_items(choice["message"], logprobs, req.tool_names)
            return response_object(req, response_id, created, model_id, status_of(choice["finish_reason"]), output,
                                   response_usage(completion["usage"]))

        if not req.background:
            response = await answer()
            await self._save(req, owner, response, history)
            return response
        queued = response_object(req, response_id, created, model_id, "queued", [])
        await self._queue(req, owner, queued, history, answer)
        return queued

    async def stream(self, req: ResponsesRequest, model: ModelClient, model_id: str,
                     owner: str | None) -> AsyncIterator[dict]:
        """The events (dicts, framed at the edge); an error before the model's first chunk raises before the
        first event. A background one's are kept, to be read again (`background_stream.py`)."""
        if req.background:
            self.background.check_room(owner)
        history, chat = await self._prepare(req, owner)
        events = ResponseEvents(req, new_id("resp_"), model_id)
        if req.background:
            live = BackgroundStream(events, self.store, owner)

            async def turn() -> dict:
                async for event in self._reply(model, chat, owner, events, live.started):
                    live.add(event)
                return events.final()

            await self._queue(req, owner, events.response("queued"), history, turn, live)
            async for event in live.follow(-1):
                yield event
            return
        try:
            async for event in self._reply(model, chat, owner, events, events.start):
                yield event
            response = events.final()
            await self._save(req, owner, response, history)
        except OpenAIError as e:
            if not events.sequence:  # before the first event: answered with its status
                raise
            for event in events.fail(e.body()["error"]):
                yield event
            return
        yield events.event("response.completed", response=response)

    async def follow(self, response_id: str, owner: str | None, starting_after: int | None) -> AsyncIterator[dict]:
        """A background stream's events, from the first or after `starting_after`."""
        if starting_after is not None and starting_after < 0:
            raise OpenAIError(400, "starting_after: must be a sequence number (0 or more)", "starting_after")
        return await self.background.follow(owner, response_id, -1 if starting_after is None else starting_after)

    async def _reply(self, model: ModelClient, chat: ChatCompletionRequest, owner: str | None,
                     events: ResponseEvents, opening: Callable[[], list[dict]]) -> AsyncIterator[dict]:
        """The events of the model's reply: `opening()` once its first chunk comes, then its items' (a stream
        error raises)."""
        started = False
        async for chunk in model.chat_stream(chat, owner):
            if isinstance(chunk, StreamError):
                raise OpenAIError(chunk.status, chunk.message, chunk.param)
            if not started:
                started = True
                for event in opening():
                    yield event
            for event in events.feed(chunk):
                yield event
        for event in events.close():
            yield event

    async def _queue(self, req: ResponsesRequest, owner: str | None, queued: dict, history: list[dict],
                     turn: Callable[[], Awaitable[dict]], stream: BackgroundStream | None = None) -> None:
        """Store the queued response and run its turn in the background."""
        await self.store.save(owner, queued, history + req.input_messages(), req.input_items())

        async def save(response: dict) -> None:
            await self._save(req, owner, response, history)

        await self.background.start(owner, queued["id"], turn, save, stream)

    async def retrieve(self, response_id: str, owner: str | None) -> dict:
        return await self.background.current(owner, await self.store.load(owner, response_id))

    async def cancel(self, response_id: str, owner: str | None) -> dict:
        return await self.background.cancel(owner, response_id)

    async def input_items(self, response_id: str, owner: str | None, after: str | None, limit: int,
                          order: str) -> dict:
        """The response's input items, newest first unless `order` is asc (stored before this route existed:
        none)."""
        items = (await self.store.load(owner, response_id)).get("input_items", [])
        return cursor_page(items[::-1] if order == "desc" else items, after, limit)

    async def delete(self, response_id: str, owner: str | None) -> dict:
        await self.store.delete(owner, response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def _prepare(self, req: ResponsesRequest, owner: str | None) -> tuple[list[dict], ChatCompletionRequest]:
        """The earlier turns' messages, and the chat request of this one."""
        if req.store:  # refused before any work when the key keeps as many as its quota allows
            await self.store.check_room(owner)
        await self._read_files(req, owner)
        history = []
        if req.previous_response_id is not None:
            history = (await self.store.load(owner, req.previous_response_id, "previous_response_id"))["messages"]
        elif req.conversation_id is not None:
            history = await self.conversations.history(req, owner)
        try:
            return history, req.to_chat(history)
        except ValidationError as e:
            raise _in_responses_terms(from_validation_error(e)) from None

    async def _read_files(self, req: ResponsesRequest, owner: str | None) -> None:
        """Each `input_image` given by `file_id` takes the upload's bytes as a data URL (its reader bounds them)."""
        for i, item in enumerate(req.input):
            for j, part in enumerate(item.content if isinstance(item, MessageItem) and
                                     not isinstance(item.content, str) else ()):
                if isinstance(part, ImagePart) and part.file_id is not None:
                    data = await self.files.image_bytes(part.file_id, owner, self.max_image_bytes,
                                                        f"input[{i}].content[{j}].file_id")
                    part.image_url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()

    async def _save(self, req: ResponsesRequest, owner: str | None, response: dict, history: list[dict]) -> None:
        input_items = req.input_items()  # one id per item, wherever it is kept
        if req.store:
            turn = turn_messages(response["output"], req.tool_names)
            await self.store.save(owner, response, history + req.input_messages() + turn, input_items)
        if req.conversation_id is not None:
            await self.conversations.append(req.conversation_id, owner, input_items + response["output"])


# The chat request's fields, as the Responses request names them
_CHAT_NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
               "response_format": "text.format"}


def _in_responses_terms(error: OpenAIError) -> OpenAIError:
    """An error of the chat request built from a response request, naming the response request's fields."""
    message, param = error.message, error.param
    for chat_name, name in _CHAT_NAMES.items():
        message = message.replace(chat_name, name)
        if param is not None and (param == chat_name or param.startswith(chat_name + ".")):
            param = name + param[len(chat_name):]
    return OpenAIError(error.status, message, param, error.code)

