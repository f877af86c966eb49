"""The bodies of the Conversations API's routes; items are the Responses API's input items."""

from pydantic import Field, TypeAdapter

from deployments.api.request_model import RequestModel
from deployments.api.responses.protocol import InputItem, ResponsesRequest

MAX_ITEMS = 20  # OpenAI's bound on the items one create or add may carry
Metadata = dict[str, str]


class ConversationCreate(RequestModel):
    items: list[InputItem] | None = Field(None, max_length=MAX_ITEMS)
    metadata: Metadata | None = Field(None, max_length=16)


class ConversationUpdate(RequestModel):
    metadata: Metadata = Field(max_length=16)


class ItemsCreate(RequestModel):
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS)


_ITEMS = TypeAdapter(list[InputItem])


def stored_items(items: list) -> list[dict]:
    """Input items as the conversation keeps and lists them: OpenAI's item objects, each with an id."""
    return ResponsesRequest.model_construct(input=items).input_items()


def history_of(items: list[dict], req: ResponsesRequest) -> list[dict]:
    """A conversation's items as chat messages, before `req`'s turn (its tools name the calls)."""
    return req.model_copy(update={"input": _ITEMS.validate_python(items)}).input_messages()
