"""The scheduler's waiting sequences, in the order they are admitted: priorities, then owners and their
requests in turn."""

import heapq
from collections import Counter, OrderedDict, deque

from runtime.core.sequence import Request, Sequence, SequenceStatus


class WaitingQueue:
    """Waiting sequences in admission order. The highest priority first; within it, sequences that were
    preempted (by arrival: they had their turn), then fresh ones: owners in turn, each owner's requests in
    turn, one sequence a turn, so with two owners waiting each gets every other seat. An owner already running
    `cap` sequences is passed over (its preempted sequences too) while another owner under it waits, so one
    that filled the engine alone gives the seats it frees to newcomers; alone, it still gets every seat.

    `peek` costs O(1) plus the owners passed over at their cap (at most max_num_seqs / cap of them) and the
    finished sequences it drops (each once): sequences finished while waiting leave lazily."""

    def __init__(self):
        self._preempted: list[tuple[tuple[int, int, int], Sequence]] = []  # heap by sort key
        # priority -> owner -> request -> its fresh waiting sequences; dict order is the turn order
        self._fresh: dict[int, OrderedDict[str | None, OrderedDict[Request, deque[Sequence]]]] = {}

    def push(self, seq: Sequence) -> None:
        """Queue a sequence not yet started, at the end of its owner's and its request's turn."""
        owners = self._fresh.setdefault(seq.priority, OrderedDict())
        owners.setdefault(seq.request.owner, OrderedDict()).setdefault(seq.request, deque()).append(seq)

    def push_preempted(self, seq: Sequence) -> None:
        heapq.heappush(self._preempted, (seq.order, seq))

    def peek(self, running: Counter, cap: int) -> Sequence | None:
        """The sequence to admit next (`running`: running sequences per owner), or None."""
        while self._preempted and self._preempted[0][1].status is not SequenceStatus.WAITING:
            heapq.heappop(self._preempted)
        while self._fresh:
            priority = min(self._fresh)
            owners = self._fresh[priority]
            under = next((o for o in owners if running[o] < cap), None)
            if self._preempted and self._preempted[0][0][0] <= priority:
                top = self._preempted[0][1]
                if top.priority < priority or under is None or running[top.request.owner] < cap:
                    return top
            owner = next(iter(owners)) if under is None else under
            requests = owners[owner]
            request, seqs = next(iter(requests.items()))
            if seqs[0].status is SequenceStatus.WAITING:
                return seqs[0]
            self._remove_front(priority, owner, request)  # finished while waiting
        return self._preempted[0][1] if self._preempted else None

    def best_priority(self) -> int | None:
        """The highest priority (lowest value) waiting, or None; a finished preempted sequence may still count."""
        fresh = min(self._fresh, default=None)
        if not self._preempted:
            return fresh
        preempted = self._preempted[0][0][0]
        return preempted if fresh is None else min(fresh, preempted)

    def pop(self, seq: Sequence) -> None:
        """Take the sequence `peek` returned; its owner and request go to the end of their turns."""
        if self._preempted and self._preempted[0][1] is seq:
            heapq.heappop(self._preempted)
            return
        owners = self._fresh[seq.priority]
        owners.move_to_end(seq.request.owner)
        owners[seq.request.owner].move_to_end(seq.request)
        self._remove_front(seq.priority, seq.request.owner, seq.request)

    def _remove_front(self, priority: int, owner: str | None, request: Request) -> None:
        owners = self._fresh[priority]
        seqs = owners[owner][request]
        seqs.popleft()
        if not seqs:
            del owners[owner][request]
            if not owners[owner]:
                del owners[owner]
                if not owners:
                    del self._fresh[priority]
