"""What the prefix-aware router hashes a chat by: its text, each picture as its URL's hash, so the same picture in
the same place routes as the same prefix and another picture shares only the prefix before it; and how much busier
than the least loaded replica a prefix's owner may be and still take it."""

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.prefix_router import CHUNK_CHARS, PrefixAwareRouter, prefix_hashes, route_text
from testing.vision_checkpoints import data_url, random_picture

TEXT = "Describe this picture in the words a careful museum curator would choose for its label. "


def chat(picture_url: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": TEXT}, {"type": "image_url", "image_url": {"url": picture_url}},
        {"type": "text", "text": TEXT}]}])


def test_pictures_are_part_of_the_route():
    first, again, other = (prefix_hashes(route_text(chat(data_url(random_picture(seed))))) for seed in (1, 1, 2))
    before_picture = len(f"<user>{TEXT}") // CHUNK_CHARS  # chunks wholly before the picture
    assert first == again
    assert first[:before_picture] == other[:before_picture] and first[before_picture] != other[before_picture]
    assert len(first) == len(other) > before_picture + 1


@dataclass(frozen=True)
class _ReplicaID:
    unique_id: str


@dataclass(frozen=True)
class _Replica:
    replica_id: _ReplicaID


class _RouterWithoutServe(PrefixAwareRouter):
    replica_queue_len_cache: dict = {}  # Serve's cache of each replica's queue length, as the test says


def _router(loads: dict) -> PrefixAwareRouter:
    """The router as Serve would drive it, without Serve: queue lengths as given."""
    router = _RouterWithoutServe.__new__(_RouterWithoutServe)
    router.initialize_state()
    router.replica_queue_len_cache = loads
    return router


def _session_turn(words: int) -> SimpleNamespace:
    text = " ".join(f"word{i}" for i in range(words))
    return SimpleNamespace(args=[ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}])])


def test_a_long_cached_prefix_stays_on_its_replica_past_the_load_a_short_one_leaves_it_at():
    """Tolerance: 4 requests, and one more per 512 characters the owner holds, at most 12 more: the owner of a
    3,095-character prompt (48 whole chunks, 3,072 characters) keeps it 10 requests busier than the least loaded
    replica, not 11; the owner of a 2-chunk prompt only 4 busier."""
    a, b = _ReplicaID("a"), _ReplicaID("b")
    replicas = [_Replica(a), _Replica(b)]
    long_turn, short_turn = _session_turn(400), _session_turn(20)
    assert len(route_text(long_turn.args[0])) == 3095 and 128 <= len(route_text(short_turn.args[0])) < 512
    for turn, busier_kept, busier_left in ((long_turn, 10, 11), (short_turn, 4, 5)):
        router = _router({a: 0, b: 0})
        router.on_request_routed(turn, a, None)
        for a_load, kept in ((busier_kept, True), (busier_left, False)):
            router.replica_queue_len_cache = {a: a_load, b: 0}
            ranks = asyncio.run(router.choose_replicas(replicas, turn))
            assert (ranks[0] == [replicas[0]]) is kept, (len(route_text(turn.args[0])), a_load)
