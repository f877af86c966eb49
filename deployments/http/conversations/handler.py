"""The Conversations API: a conversation's object and items, created, read, changed and deleted; and the turns
/v1/responses adds to the conversation a request names (`conversation`)."""

from deployments.api.conversations.protocol import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    history_of,
    stored_items,
)
from deployments.api.format import now
from deployments.api.ids import new_id
from deployments.api.pagination import cursor_page, list_page
from deployments.api.responses.protocol import ResponsesRequest
from deployments.errors import OpenAIError
from deployments.http.conversations.store import ConversationStore


class ConversationsAPI:
    def __init__(self, store: ConversationStore):
        self.store = store

    async def create(self, body: ConversationCreate, owner: str | None) -> dict:
        conversation = {"id": new_id("conv_"), "object": "conversation", "created_at": now(),
                        "metadata": body.metadata or {}}
        await self.store.save(owner, conversation)
        if body.items:
            await self.store.add(owner, conversation["id"], stored_items(body.items))
        return conversation

    async def retrieve(self, conversation_id: str, owner: str | None) -> dict:
        return (await self.store.load(owner, conversation_id))["conversation"]

    async def update(self, conversation_id: str, body: ConversationUpdate, owner: str | None) -> dict:
        record = await self.store.load(owner, conversation_id)
        record["conversation"]["metadata"] = body.metadata
        await self.store.save(owner, record["conversation"])
        return record["conversation"]

    async def delete(self, conversation_id: str, owner: str | None) -> dict:
        await self.store.delete(owner, conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def items(self, conversation_id: str, owner: str | None, after: str | None, limit: int,
                    order: str) -> dict:
        """The items, newest first unless `order` is asc."""
        items = (await self.store.load(owner, conversation_id))["items"]
        return cursor_page(items[::-1] if order == "desc" else items, after, limit)

    async def add_items(self, conversation_id: str, body: ItemsCreate, owner: str | None) -> dict:
        added = stored_items(body.items)
        await self.append(conversation_id, owner, added)
        return list_page(added, False)

    async def item(self, conversation_id: str, item_id: str, owner: str | None) -> dict:
        items = (await self.store.load(owner, conversation_id))["items"]
        return next((i for i in items if i["id"] == item_id), None) or _item_not_found(item_id)

    async def delete_item(self, conversation_id: str, item_id: str, owner: str | None) -> dict:
        record = await self.store.load(owner, conversation_id)
        if all(i["id"] != item_id for i in record["items"]):
            _item_not_found(item_id)
        await self.store.delete_item(owner, conversation_id, item_id)
        return record["conversation"]

    async def history(self, req: ResponsesRequest, owner: str | None) -> list[dict]:
        """The chat messages of the conversation `req` continues."""
        record = await self.store.load(owner, req.conversation_id, "conversation")
        return history_of(record["items"], req)

    async def append(self, conversation_id: str, owner: str | None, items: list[dict]) -> None:
        await self.store.add(owner, conversation_id, items)


def _item_not_found(item_id: str):
    raise OpenAIError(404, f"Item with id '{item_id[:64]}' not found.", "item_id", "item_not_found")
