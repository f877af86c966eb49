"""Stored conversations: each one's object (id, created_at, metadata) and its items, in the app's object store.

Kept under `conversations/<owner>/<id>.json` (owner: the API key's digest, or `public` with auth off), beside
the stored responses, so a conversation continues on any replica and after a restart, and one key never sees
another's. Two responses that continue one conversation at the same time each append their turn to what they
read: the later write wins (as a client that keeps its own history would see it, one turn is lost).
"""

import asyncio
import re

from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, ObjectStore, StoreError

_ID = re.compile(r"conv_[0-9a-f]{32}")  # what new_id("conv_") makes: never a path into another owner's keys


class ConversationStore:
    def __init__(self, store: ObjectStore):
        self.store = store

    async def load(self, owner: str | None, conversation_id: str, param: str | None = None) -> dict:
        """`{"conversation", "items"}`; a conversation this owner did not create is not found."""
        try:
            return await asyncio.to_thread(self.store.get_json, self._key(owner, conversation_id, param))
        except MissingObjectError:
            raise not_found(conversation_id, param) from None
        except StoreError as e:
            raise OpenAIError(503, f"stored conversations are unreachable: {e}") from e

    async def save(self, owner: str | None, record: dict) -> None:
        key = self._key(owner, record["conversation"]["id"])
        try:
            await asyncio.to_thread(self.store.put_json, key, record)
        except StoreError as e:
            raise OpenAIError(503, f"the conversation could not be stored ({e}); retry") from e

    async def delete(self, owner: str | None, conversation_id: str) -> None:
        key = self._key(owner, conversation_id)
        try:
            if await asyncio.to_thread(self.store.size, key) is None:
                raise not_found(conversation_id)
            await asyncio.to_thread(self.store.delete, key)
        except StoreError as e:
            raise OpenAIError(503, f"stored conversations are unreachable: {e}") from e

    @staticmethod
    def _key(owner: str | None, conversation_id: str, param: str | None = None) -> str:
        if not _ID.fullmatch(conversation_id):
            raise not_found(conversation_id, param)
        return f"conversations/{owner or 'public'}/{conversation_id}.json"


def not_found(conversation_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"Conversation with id '{conversation_id[:64]}' not found.", param,
                       "conversation_not_found")
