"""Admission by API key, before a request reaches a model's queue.

A model's replicas each take `max_ongoing_requests` at a time; what is over waits in Serve's queue, first come
first served, which knows nothing of keys: one key's backlog of hundreds of streams would stand in front of
another key's first request. Here, in the ingress, each key has at most `max_requests_per_key` requests under
way (a stream until its last byte is sent) and at most `max_waiting_per_key` more waiting for one of its own
slots; past that the request is refused at once with a 429 and `Retry-After`, and its connection closed. A
key's waiting requests never reach Serve's queue, so another key's request finds only in-flight work ahead of
it there.

It applies to POSTs carrying a configured key, the requests that do work. Without API keys every caller is the
same one, and nothing is held back. A request with a wrong key passes on to its route's 401, which refuses it
before its body is read. The app's bounds are shared out among the replicas that serve HTTP
(`AppConfig.key_bounds_per_replica`): each replica holds its share. Serve's Python proxy applies the app's
bounds before it routes (proxy_admission.py), so a key's backlog does not stand in the proxy's work either.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from starlette.datastructures import Headers

from deployments.errors import OpenAIError
from deployments.http.anthropic.handler import anthropic_error_of
from deployments.http.auth import ApiKeys
from deployments.http.request_limits import send_json

RETRY_AFTER_S = 1


@dataclass
class _KeyGate:
    slots: anyio.Semaphore
    waiting: int = 0
    users: int = 0  # requests holding or waiting for a slot: the gate goes when none is left


class KeyGates:
    """Each key's turns: at most `max_in_flight` held at once and `max_waiting` more waiting, first come first
    served, for a slot (the bounds a key's first request sets hold while it has requests)."""

    def __init__(self):
        self._gates: dict[str, _KeyGate] = {}

    @asynccontextmanager
    async def turn(self, key: str, max_in_flight: int, max_waiting: int) -> AsyncIterator[bool]:
        """Holds one of `key`'s slots, waiting for one in turn, and yields True; yields False at once when the key
        already has `max_waiting` waiting."""
        gate = self._gates.get(key) or self._gates.setdefault(key, _KeyGate(anyio.Semaphore(max_in_flight)))
        gate.users += 1
        try:
            try:
                gate.slots.acquire_nowait()
            except anyio.WouldBlock:
                if gate.waiting >= max_waiting:
                    yield False
                    return
                gate.waiting += 1
                try:
                    await gate.slots.acquire()
                finally:
                    gate.waiting -= 1
            try:
                yield True
            finally:
                gate.slots.release()
        finally:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[key]


class KeyAdmission:
    """ASGI middleware: per-key bounds on requests in flight and waiting (see the module's docstring)."""

    def __init__(self, app, keys: ApiKeys, max_in_flight: int, max_waiting: int):
        self.app = app
        self.keys = keys
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self._gates = KeyGates()

    async def __call__(self, scope, receive, send):
        owner = None
        if scope["type"] == "http" and scope["method"] == "POST" and self.keys.enabled:
            owner = self.keys.known_owner(Headers(scope=scope))
        if owner is None:
            return await self.app(scope, receive, send)
        async with self._gates.turn(owner, self.max_in_flight, self.max_waiting) as admitted:
            if not admitted:
                return await refuse_too_many(scope, send, self.max_in_flight, self.max_waiting)
            await self.app(scope, receive, send)


async def refuse_too_many(scope, send, in_flight: int, waiting: int) -> None:
    """A 429 in OpenAI's shape, or Anthropic's on its routes."""
    error = OpenAIError(429, f"This API key has {in_flight} requests in progress and {waiting} waiting, the most "
                             f"it may have; retry after the earlier ones finish.", code="rate_limit_exceeded")
    body = anthropic_error_of(error) if scope["path"].startswith("/v1/messages") else error.body()
    # the body is unread: the connection cannot be reused
    await send_json(send, 429, body, [(b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")])
