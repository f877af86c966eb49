"""Stored conversations: each one's object (id, created_at, metadata) and its items, in the app's object store.

The object is kept under `conversations/<owner>/<id>.json` (owner: the API key's digest, or `public` with auth
off), beside the stored responses, so a conversation continues on any replica and after a restart, and one key
never sees another's. Its items are a log that is only ever added to: each change (items added, one deleted) is an
object of its own under `conversation-items/<owner>/<id>/`, named by the writer's clock and a random tail, read in
name order (a deletion removes its item wherever the item stands: the clocks of two replicas may disagree). Two
responses that continue one conversation at the same time, on any replicas, both keep their turn; no write
replaces another's.
"""

import asyncio
import re
import secrets
import time

from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, ObjectStore, StoreError

_ID = re.compile(r"conv_[0-9a-f]{32}")  # what new_id("conv_") makes: never a path into another owner's keys


class ConversationStore:
    def __init__(self, store: ObjectStore):
        self.store = store

    async def load(self, owner: str | None, conversation_id: str, param: str | None = None) -> dict:
        """`{"conversation", "items"}`; a conversation this owner did not create is not found."""
        key = self._key(owner, conversation_id, param)
        try:
            record = await asyncio.to_thread(self.store.get_json, key)
            changes = await asyncio.to_thread(self._changes, self._items_prefix(owner, conversation_id))  # oldest first
        except MissingObjectError:
            raise not_found(conversation_id, param) from None
        except StoreError as e:
            raise OpenAIError(503, f"stored conversations are unreachable: {e}") from e
        items = record.get("items", []) + [i for change in changes for i in change.get("items", [])]
        deleted = {change["deleted"] for change in changes if "deleted" in change}  # item ids are never reused
        return {"conversation": record["conversation"], "items": [i for i in items if i["id"] not in deleted]}

    async def save(self, owner: str | None, conversation: dict) -> None:
        """The conversation's object (its items are kept apart: `add`; those of one stored before the log stay in
        it)."""
        key = self._key(owner, conversation["id"])
        try:
            try:
                record = await asyncio.to_thread(self.store.get_json, key)
            except MissingObjectError:
                record = {}
            await asyncio.to_thread(self.store.put_json, key, {**record, "conversation": conversation})
        except StoreError as e:
            raise OpenAIError(503, f"the conversation could not be stored ({e}); retry") from e

    async def add(self, owner: str | None, conversation_id: str, items: list[dict]) -> None:
        await self._log(owner, conversation_id, {"items": items})

    async def delete_item(self, owner: str | None, conversation_id: str, item_id: str) -> None:
        await self._log(owner, conversation_id, {"deleted": item_id})

    async def delete(self, owner: str | None, conversation_id: str) -> None:
        key = self._key(owner, conversation_id)
        try:
            if await asyncio.to_thread(self.store.size, key) is None:
                raise not_found(conversation_id)
            await asyncio.to_thread(self.store.delete, key)
            changes = await asyncio.to_thread(self.store.list, self._items_prefix(owner, conversation_id))
            await asyncio.to_thread(self.store.delete_many, changes)
        except StoreError as e:
            raise OpenAIError(503, f"stored conversations are unreachable: {e}") from e

    async def _log(self, owner: str | None, conversation_id: str, change: dict) -> None:
        """Add `change` to the item log of a conversation that exists."""
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}.json"
        try:
            if await asyncio.to_thread(self.store.size, self._key(owner, conversation_id)) is None:
                raise not_found(conversation_id)
            await asyncio.to_thread(self.store.put_json, self._items_prefix(owner, conversation_id) + name, change)
        except StoreError as e:
            raise OpenAIError(503, f"the conversation could not be stored ({e}); retry") from e

    def _changes(self, prefix: str) -> list[dict]:
        return self.store.get_json_many(self.store.list(prefix))

    def _items_prefix(self, owner: str | None, conversation_id: str) -> str:
        key = self._key(owner, conversation_id)
        return "conversation-items/" + key.removeprefix("conversations/").removesuffix(".json") + "/"

    @staticmethod
    def _key(owner: str | None, conversation_id: str, param: str | None = None) -> str:
        if not _ID.fullmatch(conversation_id):
            raise not_found(conversation_id, param)
        return f"conversations/{owner or 'public'}/{conversation_id}.json"


def not_found(conversation_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"Conversation with id '{conversation_id[:64]}' not found.", param,
                       "conversation_not_found")
