"""Token-budget scheduling with chunked prefill, priorities and preemption by recompute.

Each step spends at most `max_num_batched_tokens`: first on running sequences
(decodes before unfinished prefills, each in priority order), then on waiting
sequences, whose prompts are chunked into whatever budget is left, so prefill
and decode share a batch. Lower `priority` values run first; ties go to the
earlier arrival, so nothing of equal priority starves. When blocks run out,
the lowest-priority, newest running sequence not yet scheduled this step is
preempted: its blocks are freed (they stay in the prefix cache) and it is
recomputed later.
"""

import heapq
from dataclasses import dataclass, field

from runtime.kv_cache import BlockManager
from runtime.lora import AdapterSlots, LoRAAdapter
from runtime.sequence import Request, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)  # decodes first
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    lora_loads: list[tuple[int, LoRAAdapter]] = field(default_factory=list)  # (slot, adapter) to load first

    @property
    def sampled(self) -> list[Sequence]:
        """Sequences whose chunk reaches their last token, so a new token is sampled."""
        return [s for s, n in zip(self.seqs, self.num_new_tokens) if s.num_computed_tokens + n == s.num_tokens]

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 adapters: AdapterSlots | None = None):
        self.adapters = adapters  # LoRA slots: a sequence is admitted only once its adapter has one
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = block_manager
        self.waiting: list[tuple[tuple[int, int, int], Sequence]] = []  # heap by sort key
        self.running: list[Sequence] = []
        self.num_waiting = 0  # sequences in the heap still waiting (aborted ones leave lazily)
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        for seq in request.seqs:
            self._push_waiting(seq)

    def finish(self, seq: Sequence) -> None:
        """Retire a sequence (done or aborted); waiting ones leave the heap lazily."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq)
            self._unpin(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.num_waiting -= 1
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}
        preempted = False
        order = sorted(self.running, key=lambda s: (s.num_tokens - s.num_computed_tokens > 1, s.sort_key()))
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.can_grow(seq, seq.num_computed_tokens + n):
                victim = max((s for s in self.running if s not in scheduled), key=Sequence.sort_key)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self.blocks.grow(seq, seq.num_computed_tokens + n)
                scheduled[seq] = n
                budget -= n
        if not preempted:
            budget = self._admit(scheduled, budget)
        batch = ScheduledBatch(lora_loads=self.adapters.take_pending() if self.adapters is not None else [])
        for seq, n in sorted(scheduled.items(), key=lambda item: item[1] != 1):
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.num_decodes += n == 1
        return batch

    def _admit(self, scheduled: dict[Sequence, int], budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0][1]
            if seq.status is not SequenceStatus.WAITING:
                heapq.heappop(self.waiting)  # aborted while waiting
                continue
            hits = self.blocks.cached_prefix(seq)
            cached = len(hits) * self.blocks.block_size
            n = min(seq.num_tokens - cached, budget)
            if not self.blocks.can_admit(hits, cached + n) or not self._pin(seq):
                break
            heapq.heappop(self.waiting)
            self.num_waiting -= 1
            self.blocks.admit(seq, hits, cached + n)
            seq.num_computed_tokens = cached
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled[seq] = n
            budget -= n
        return budget

    def _pin(self, seq: Sequence) -> bool:
        """Pin a slot holding the sequence's adapter (loading it if need be); False when every slot is busy."""
        adapter = seq.request.adapter
        if adapter is None:
            return True
        seq.lora_slot = self.adapters.acquire(adapter)
        return seq.lora_slot is not None

    def _unpin(self, seq: Sequence) -> None:
        if seq.lora_slot is not None:
            self.adapters.release(seq.lora_slot)
            seq.lora_slot = None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        self._unpin(seq)
        seq.num_computed_tokens = 0
        self._push_waiting(seq)
        self.num_preemptions += 1

    def _push_waiting(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, (seq.sort_key(), seq))
        self.num_waiting += 1
