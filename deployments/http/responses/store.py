"""Stored responses: each one's reply and the whole conversation up to it, in the app's object store.

Kept under `responses/<owner>/<id>.json` (owner: the API key's digest, or `public` with auth off), so a
conversation continues through `previous_response_id` on any replica and after a restart, and one key
never sees another's responses. A key keeps at most its quota of them, in number and bytes: a request that
would store another past it is refused before it runs (send `store: false`, or delete some).
"""

import asyncio
import json
import re

from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, ObjectStore, StoreError
from deployments.storage.usage import OwnerUsage, Quota

_ID = re.compile(r"resp_[0-9a-f]{32}")  # what new_id("resp_") makes: never a path into another owner's keys


class ResponseStore:
    def __init__(self, store: ObjectStore, per_key: Quota | None = None):
        self.store = store
        self.per_key = per_key
        self.usage = OwnerUsage(self._measure)

    async def check_room(self, owner: str | None) -> None:
        """A 400 when this owner keeps as many responses, or bytes of them, as its quota allows."""
        if self.per_key is None:
            return
        try:
            await asyncio.to_thread(self.usage.room, owner, self.per_key, "stored responses", "store")
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    async def save(self, owner: str | None, response: dict, messages: list[dict], input_items: list[dict]) -> None:
        """A response and its conversation; a background one's, over its earlier record."""
        await self.put(owner, {"response": response, "messages": messages, "input_items": input_items},
                       replacing=response.get("background", False))

    async def put(self, owner: str | None, record: dict, replacing: bool = False) -> None:
        """A response's record (its conversation and input items). `replacing`: it may be over its earlier self,
        whose size is read first, so the record counts once (a background response's, written as it goes)."""
        key, data = self._key(owner, record["response"]["id"]), json.dumps(record).encode()
        try:
            old = await asyncio.to_thread(self.store.size, key) if replacing else None
            await asyncio.to_thread(self.store.put, key, data)
        except StoreError as e:
            raise OpenAIError(503, f"the response could not be stored ({e}); retry, or send store: false") from e
        self.usage.add(owner, int(old is None), len(data) - (old or 0))

    async def stamp(self, owner: str | None, response_id: str, at: float | None) -> None:
        """Record when the replica running a background response last said it runs it (None: it has finished).
        Kept beside the responses, not in their records, which another replica's cancel may be writing."""
        key = f"response-stamps/{self._key(owner, response_id)}"
        try:
            if at is None:
                await asyncio.to_thread(self.store.delete, key)
            else:
                await asyncio.to_thread(self.store.put, key, json.dumps(at).encode())
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    async def stamped(self, owner: str | None, response_id: str) -> float | None:
        """When a background response's replica last stamped it; None if it never did or has finished."""
        try:
            return await asyncio.to_thread(self.store.get_json, f"response-stamps/{self._key(owner, response_id)}")
        except MissingObjectError:
            return None
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    async def put_events(self, owner: str | None, response_id: str, first: int, events: list[dict],
                         ended: bool) -> None:
        """A chunk of a background stream's events, numbered from `first` (background_stream.py)."""
        key = f"{self._events_prefix(owner, response_id)}{first:08d}.json"
        try:
            await asyncio.to_thread(self.store.put, key, json.dumps({"events": events, "ended": ended}).encode())
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    async def events(self, owner: str | None, response_id: str, after: int) -> tuple[list[dict], bool]:
        """A background stream's stored events numbered after `after`, and whether it has ended."""
        prefix = self._events_prefix(owner, response_id)
        try:
            keys = await asyncio.to_thread(self.store.list, prefix)
            firsts = [int(k[len(prefix):].removesuffix(".json")) for k in keys]
            start = max([i for i, first in enumerate(firsts) if first <= after + 1], default=0)  # holds after + 1
            chunks = await asyncio.to_thread(self.store.get_json_many, keys[start:])
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e
        events = [e for chunk in chunks for e in chunk["events"] if e["sequence_number"] > after]
        return events, bool(chunks) and chunks[-1]["ended"]

    async def has_events(self, owner: str | None, response_id: str) -> bool:
        """Whether the response was made as a background stream (its first chunk is written as it is queued)."""
        first = f"{self._events_prefix(owner, response_id)}{0:08d}.json"
        try:
            return await asyncio.to_thread(self.store.size, first) is not None
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    def _events_prefix(self, owner: str | None, response_id: str) -> str:
        return f"response-events/{self._key(owner, response_id).removesuffix('.json')}/"

    def _measure(self, owner: str | None) -> tuple[int, int]:
        sizes = self.store.sizes(f"responses/{owner or 'public'}/")
        return len(sizes), sum(sizes.values())

    async def load(self, owner: str | None, response_id: str, param: str | None = None) -> dict:
        """`{"response", "messages", "input_items"}`; a response this owner did not store is not found."""
        key = self._key(owner, response_id, param)
        try:
            return await asyncio.to_thread(self.store.get_json, key)
        except MissingObjectError:
            raise _not_found(response_id, param) from None
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    async def delete(self, owner: str | None, response_id: str) -> None:
        key = self._key(owner, response_id)
        try:
            size = await asyncio.to_thread(self.store.size, key)
            if size is None:
                raise _not_found(response_id)
            await asyncio.to_thread(self.store.delete, key)
            await asyncio.to_thread(self.store.delete, f"response-stamps/{key}")
            events = await asyncio.to_thread(self.store.list, self._events_prefix(owner, response_id))
            await asyncio.to_thread(self.store.delete_many, events)
            self.usage.add(owner, -1, -size)
        except StoreError as e:
            raise OpenAIError(503, f"stored responses are unreachable: {e}") from e

    @staticmethod
    def _key(owner: str | None, response_id: str, param: str | None = None) -> str:
        if not _ID.fullmatch(response_id):
            if param is not None:  # a field that is not a response id: a bad value, as OpenAI and SGLang say
                raise OpenAIError(400, f"{param}: {response_id[:64]!r} is not a response id (resp_ and 32 hex "
                                       "digits)", param, "invalid_value")
            raise _not_found(response_id, param)
        return f"responses/{owner or 'public'}/{response_id}.json"


def _not_found(response_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id[:64]}' not found.", param, "response_not_found")
