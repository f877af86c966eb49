"""Prefix-aware replica selection (Ray Serve's custom request router API).

The router remembers, for chunks of prompt text, which replica it last sent
them to: that replica's prefix cache most likely still holds their KV. A
request goes to the replica owning its longest known prefix while that
replica's queue is within a tolerance of the least loaded one's:
`imbalance_tolerance` requests, and one more for every
`cached_chars_per_extra_request` characters of the prefix it holds (at most
three times `imbalance_tolerance` more), since recomputing a long prefix
elsewhere costs more than waiting behind a few requests where it is cached
(an agent's session, whose prompt grows turn after turn, stays on its replica).
A prompt this router has not seen goes to its home replica, picked by
rendezvous hashing of its first chunk: every router (one per ingress
replica, each with its own memory) picks the same home, so a conversation
stays on one replica whichever ingress its turns pass through. When the
home is too busy too, the less loaded of two random replicas takes it.

A request for a LoRA adapter (`model: "<model_id>:<adapter>"`) is homed by
its adapter instead, so an adapter's requests meet on the replica that has
it loaded; its chunk hashes start from the adapter's name, as the engine's
prefix cache keys them. A chat's pictures are part of its text, each as its
URL's hash.
"""

import hashlib
import random
from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from deployments.api.chat.protocol import ChatCompletionRequest, ChatMessage, ImagePart
from deployments.api.completions.protocol import CompletionRequest
from deployments.api.generate.protocol import GenerateRequest

CHUNK_CHARS = 64


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, imbalance_tolerance: int = 4, cached_chars_per_extra_request: int = 512,
                         max_prefixes: int = 200_000, **kwargs) -> None:
        self.imbalance_tolerance = imbalance_tolerance
        self.cached_chars_per_extra_request = cached_chars_per_extra_request
        self.max_prefixes = max_prefixes
        self._owners: OrderedDict[int, ReplicaID] = OrderedDict()  # prefix hash -> replica, least recent first
        self._last: tuple[PendingRequest | None, tuple] = (None, ([], ""))  # hashed when chosen, reused when routed

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        by_id = {r.replica_id: r for r in candidate_replicas}
        load = {rid: self.replica_queue_len_cache.get(rid) or 0 for rid in by_id}
        least = min(load.values())
        hashes, home_key = self._prefix(pending_request)
        for depth in range(len(hashes), 0, -1):  # the longest known prefix first
            owner = self._owners.get(hashes[depth - 1])
            if owner in by_id and load[owner] <= least + self._tolerance(depth * CHUNK_CHARS):
                return [[by_id[owner]], [r for r in candidate_replicas if r.replica_id != owner]]
        if home_key:
            home = max(by_id, key=lambda rid: _rendezvous(home_key, rid))
            if load[home] <= least + self.imbalance_tolerance:
                return [[by_id[home]], [r for r in candidate_replicas if r.replica_id != home]]
        return [random.sample(candidate_replicas, 2), candidate_replicas]

    def _tolerance(self, cached_chars: int) -> int:
        """How many more queued requests than the least loaded replica's the owner of a prefix may have."""
        extra = cached_chars // self.cached_chars_per_extra_request
        return self.imbalance_tolerance + min(extra, 3 * self.imbalance_tolerance)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        for h in self._prefix(pending_request)[0]:
            self._owners[h] = replica_id
            self._owners.move_to_end(h)
        while len(self._owners) > self.max_prefixes:
            self._owners.popitem(last=False)

    def _prefix(self, pending_request: PendingRequest) -> tuple[list[int], str]:
        """The prompt's chunk hashes and its home key: its adapter, else its first chunk (once per request)."""
        if self._last[0] is not pending_request:
            request = pending_request.args[0] if pending_request.args else None
            text = route_text(request)
            model = getattr(request, "model", None)
            adapter = model if isinstance(model, str) and ":" in model else None
            home = adapter or (text[:CHUNK_CHARS] if len(text) >= CHUNK_CHARS else "")
            self._last = (pending_request, (prefix_hashes(text, adapter), home))
        return self._last[1]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for h in [h for h, owner in self._owners.items() if owner == replica_id]:
            del self._owners[h]


def _rendezvous(key: str, replica_id: ReplicaID) -> bytes:
    """A replica's score for a home key: the same in every process (Python's str hash is salted per process)."""
    return hashlib.blake2b(f"{replica_id.unique_id}|{key}".encode(), digest_size=8).digest()


def prefix_hashes(text: str, adapter: str | None = None) -> list[int]:
    """Chained hashes of the prompt text's whole CHUNK_CHARS-character chunks, from the adapter's name."""
    hashes, parent = [], adapter
    for end in range(CHUNK_CHARS, len(text) + 1, CHUNK_CHARS):
        parent = hash((parent, text[end - CHUNK_CHARS : end]))
        hashes.append(parent)
    return hashes


def _content(message: ChatMessage) -> str:
    """A message's text, a picture written as its URL's hash (the same picture in the same place is the same
    prefix, as the engine's block hashes take pictures in; a data: URL's hash is computed once, as Python caches
    a string's)."""
    if not isinstance(message.content, list):
        return message.content or ""
    return "".join(f"<image {hash(part.image_url.url):x}>" if isinstance(part, ImagePart) else part.text
                   for part in message.content)


def route_text(request) -> str:
    """The text that decides the route: the first prompt of the request ("" when there is none)."""
    if isinstance(request, ChatCompletionRequest):
        return "".join(f"<{m.role}>{_content(m)}" for m in request.messages)
    if isinstance(request, CompletionRequest):
        prompts = request.prompts()
    elif isinstance(request, GenerateRequest):
        prompts = request.prompts()[0]
    else:
        return ""
    if not prompts:
        return ""
    prompt = prompts[0]
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
