"""Prefix-aware replica selection (Ray Serve's custom request router API), from the replicas' own caches.

A request goes where recomputing its prompt costs least: each replica's queue length, less a credit for the
prefix of the prompt it holds (`imbalance_tolerance` requests, and one more for every
`cached_chars_per_extra_request` characters of it, at most three times `imbalance_tolerance` more), since
recomputing a long prefix elsewhere costs more than waiting behind a few requests where it is cached (an agent's
session, whose prompt grows turn after turn, stays on its replica). What a replica holds is known two ways, in
the chunk hashes of deployments/route_marks.py: what its engine reported (its `record_routing_stats`: marks
whose prefixes its pool or offload tier still holds, every `request_routing_stats_period_s`), and where this
router sent prompts since that report. The reports tell every router (one per ingress replica, each with its own
memory) what the others sent where, and what a replica evicted; `engine_reports: false` routes by the memory
alone.

A prompt no replica holds goes to its home replica, picked by rendezvous hashing of its first chunk: every
router picks the same home, so a conversation starts on one replica whichever ingress its turns pass through.
When the home is busier than the least loaded replica by more than `imbalance_tolerance`, the least loaded
takes it. A request for a LoRA adapter (`model: "<model_id>:<adapter>"`) is homed by its adapter instead, so an
adapter's requests meet on the replica that has it loaded.
"""

import hashlib
import random
import time
from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from deployments.route_marks import CHUNK_CHARS, adapter_of, route_marks

# this router's own sends count beside a replica's report for this long before the report was made: a request
# waits in the replica's queue, and its prompt is computed, before its engine can report it
SENDS_OUTLIVE_REPORT_S = 5.0


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, imbalance_tolerance: int = 4, cached_chars_per_extra_request: int = 512,
                         max_prefixes: int = 200_000, engine_reports: bool = True, **kwargs) -> None:
        self.imbalance_tolerance = imbalance_tolerance
        self.cached_chars_per_extra_request = cached_chars_per_extra_request
        self.max_prefixes = max_prefixes
        self.engine_reports = engine_reports
        # prefix hash -> (the replica this router last sent it to, when), least recent first
        self._sent: OrderedDict[int, tuple[ReplicaID, float]] = OrderedDict()
        # replica -> (its last routing stats, their marks as a set, when it reported them)
        self._reports: dict[ReplicaID, tuple[dict, frozenset, float]] = {}
        self._last: tuple[PendingRequest | None, tuple] = (None, ((), ""))  # hashed when chosen, reused when routed

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        load = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) or 0 for r in candidate_replicas}
        hashes, home_key = self._prefix(pending_request)
        held = self._held(candidate_replicas, hashes)
        home = max(load, key=lambda rid: _rendezvous(home_key, rid)) if home_key and not any(held.values()) else None

        def cost(replica: RunningReplica) -> tuple:
            rid = replica.replica_id
            credit = self._tolerance(held[rid] * CHUNK_CHARS) if held[rid] else \
                self.imbalance_tolerance if rid == home else 0
            return load[rid] - credit, -held[rid], rid != home, random.random()

        best = min(candidate_replicas, key=cost)
        return [[best], [r for r in candidate_replicas if r is not best]]

    def _tolerance(self, cached_chars: int) -> int:
        """How many more queued requests than another replica's the holder of a prefix may have and still take it."""
        extra = cached_chars // self.cached_chars_per_extra_request
        return self.imbalance_tolerance + min(extra, 3 * self.imbalance_tolerance)

    def _held(self, replicas: list[RunningReplica], hashes: tuple[int, ...]) -> dict[ReplicaID, int]:
        """How many of the prompt's chunks, from the first, each replica holds: what its engine last reported, or
        what this router sent it since, whichever is more."""
        held, reported_at = {}, {}
        for replica in replicas:
            marks, reported_at[replica.replica_id] = self._report(replica)
            held[replica.replica_id] = _deepest(hashes, marks)
        for depth in range(len(hashes), 0, -1):
            sent = self._sent.get(hashes[depth - 1])
            if sent is not None and held.get(sent[0], depth) < depth \
                    and sent[1] > reported_at[sent[0]] - SENDS_OUTLIVE_REPORT_S:
                held[sent[0]] = depth
        return held

    def _report(self, replica: RunningReplica) -> tuple[frozenset, float]:
        """The marks a replica's engine last reported held (as a set, made once per report) and when."""
        stats = replica.routing_stats if self.engine_reports else None
        if not stats:
            return frozenset(), float("-inf")
        report = self._reports.get(replica.replica_id)
        if report is None or report[0] is not stats:
            report = self._reports[replica.replica_id] = (stats, frozenset(stats.get("prefix_marks", ())),
                                                          stats.get("at", float("-inf")))
        return report[1], report[2]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        now = time.time()
        for h in self._prefix(pending_request)[0]:
            self._sent[h] = (replica_id, now)
            self._sent.move_to_end(h)
        while len(self._sent) > self.max_prefixes:
            self._sent.popitem(last=False)

    def _prefix(self, pending_request: PendingRequest) -> tuple[tuple[int, ...], str]:
        """The prompt's chunk hashes and its home key: its adapter, else its first chunk (once per request)."""
        if self._last[0] is not pending_request:
            request = pending_request.args[0] if pending_request.args else None
            hashes = route_marks(request)
            self._last = (pending_request, (hashes, adapter_of(request) or (str(hashes[0]) if hashes else "")))
        return self._last[1]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._reports.pop(replica_id, None)
        for h in [h for h, (owner, _) in self._sent.items() if owner == replica_id]:
            del self._sent[h]


def _rendezvous(key: str, replica_id: ReplicaID) -> bytes:
    """A replica's score for a home key: the same in every process (Python's str hash is salted per process)."""
    return hashlib.blake2b(f"{replica_id.unique_id}|{key}".encode(), digest_size=8).digest()


def _deepest(hashes: tuple[int, ...], marks: frozenset) -> int:
    """How many of `hashes`, from the first, the deepest of them in `marks` covers (0: none is)."""
    if marks:
        for depth in range(len(hashes), 0, -1):
            if hashes[depth - 1] in marks:
                return depth
    return 0
