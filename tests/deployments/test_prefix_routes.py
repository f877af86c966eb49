"""What the prefix-aware router hashes a chat by: its text, each picture as its URL's digest, so the same picture in
the same place routes as the same prefix and another picture shares only the prefix before it; how much busier
than the least loaded replica a prefix's holder may be and still take it; and how what the replicas' engines report
they hold meets what the router itself sent where."""

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.prefix_router import SENDS_OUTLIVE_REPORT_S, PrefixAwareRouter
from deployments.route_marks import CHUNK_CHARS, prefix_hashes, route_marks, route_text
from runtime.core.prefix_marks import PrefixMarks
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


@dataclass
class _Replica:
    replica_id: _ReplicaID
    routing_stats: dict = field(default_factory=dict)  # what Serve last had of its record_routing_stats


class _RouterWithoutServe(PrefixAwareRouter):
    replica_queue_len_cache: dict = {}  # Serve's cache of each replica's queue length, as the test says


def _router(loads: dict, **options) -> PrefixAwareRouter:
    """The router as Serve would drive it, without Serve: queue lengths as given."""
    router = _RouterWithoutServe.__new__(_RouterWithoutServe)
    router.initialize_state(**options)
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


def _chosen(router: PrefixAwareRouter, replicas: list[_Replica], turn) -> _Replica:
    ranks = asyncio.run(router.choose_replicas(replicas, turn))
    return ranks[0][0]


def test_the_replica_whose_engine_reports_the_prefix_takes_it_though_this_router_never_sent_it():
    """Each replica in turn reports the prompt's marks: it takes the prompt, though 3 requests busier. Without
    the reports, the prompt goes to its home, whichever replica reports it."""
    a, b = _ReplicaID("a"), _ReplicaID("b")
    turn = _session_turn(400)
    for holder in (a, b):
        replicas = [_Replica(a), _Replica(b)]
        replicas[holder == b].routing_stats = {"prefix_marks": list(route_marks(turn.args[0])), "at": time.time()}
        loads = {a: 0, b: 0, holder: 3}
        assert _chosen(_router(loads), replicas, turn).replica_id == holder
        homes = {_chosen(_router({a: 0, b: 0}, engine_reports=False), replicas, turn).replica_id for _ in range(3)}
        assert len(homes) == 1


def test_a_shorter_reported_prefix_counts_for_less_than_a_longer_one():
    """The previous turn's prefix (a) against the whole prompt (b), b two requests busier: b's longer prefix earns
    it more than two requests' credit."""
    a, b = _ReplicaID("a"), _ReplicaID("b")
    turn = _session_turn(400)
    marks = list(route_marks(turn.args[0]))
    replicas = [_Replica(a, {"prefix_marks": marks[:8], "at": time.time()}),
                _Replica(b, {"prefix_marks": marks, "at": time.time()})]
    assert _chosen(_router({a: 0, b: 2}), replicas, turn).replica_id == b
    assert _chosen(_router({a: 0, b: 9}), replicas, turn).replica_id == a


def test_a_send_counts_until_a_report_made_well_after_it_says_the_prefix_is_gone():
    """The router sent the prompt to a; b reports holding it and is one request busier. a's report lacking it,
    made soon after the send (its prompt may not be computed yet), leaves the send counting: a. Made
    SENDS_OUTLIVE_REPORT_S after (a evicted it): b."""
    a, b = _ReplicaID("a"), _ReplicaID("b")
    turn = _session_turn(400)
    for report_delay, chosen in ((1.0, a), (SENDS_OUTLIVE_REPORT_S + 1, b)):
        router = _router({a: 0, b: 1})
        router.on_request_routed(turn, a, None)
        sent = time.time()
        replicas = [_Replica(a, {"prefix_marks": [], "at": sent + report_delay}),
                    _Replica(b, {"prefix_marks": list(route_marks(turn.args[0])), "at": sent})]
        assert _chosen(router, replicas, turn).replica_id == chosen


def test_route_marks_start_from_the_adapter_and_the_salt():
    """The same text under another adapter or tenant's salt is another prefix, as the engine's blocks are."""
    text = "x" * 200
    plain, salted, other_salt, adapted = (prefix_hashes(text, *start) for start in
                                          ((None, None), (None, "k1"), (None, "k2"), ("m:fr", None)))
    assert len(plain) == 3 and len({plain[0], salted[0], other_salt[0], adapted[0]}) == 4


def test_a_prompt_sharing_the_start_of_a_reported_one_is_credited_up_to_the_last_power_of_two_before_they_part():
    """A replica reports a long session (as its engine does: the deepest mark and those at powers of two); another
    session shares its first 40-odd chunks: its credit is 32 chunks' (2,048 characters: 4 + 4 requests)."""
    a, b = _ReplicaID("a"), _ReplicaID("b")
    words = [f"word{i}" for i in range(400)]
    reported, other = _session_turn(400), SimpleNamespace(args=[ChatCompletionRequest(model="m", messages=[
        {"role": "user", "content": " ".join(words[:300] + ["elsewhere"] * 100)}])])
    marks, other_marks = route_marks(reported.args[0]), route_marks(other.args[0])
    shared = next(i for i, (x, y) in enumerate(zip(marks, other_marks)) if x != y)
    assert 32 < shared < 64
    kept = PrefixMarks(max_blocks=1000)
    kept.track(list(range(len(marks))), marks)
    report = {"prefix_marks": kept.held(lambda h: True), "at": time.time()}
    for a_load, chosen in ((8, a), (9, b)):
        replicas = [_Replica(a, report), _Replica(b)]
        assert _chosen(_router({a: a_load, b: 0}), replicas, other).replica_id == chosen
