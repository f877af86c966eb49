"""Token-budget scheduling with chunked prefill, priorities, fair admission and preemption by recompute.

Each step spends at most `max_num_batched_tokens`: first on running sequences
(decodes before unfinished prefills, each in priority order), then on waiting
sequences, whose prompts are chunked into whatever budget is left, so prefill
and decode share a batch. Lower `priority` values run first. Within a
priority, waiting sequences are admitted fairly (see `WaitingQueue`): owners
(API keys) in turn, each owner's requests in turn, so neither a request with
many sequences nor an owner with many requests holds the others back; an
owner over its cap gives a seat back to a newcomer under it. When blocks run
out, the lowest-priority, newest running sequence not yet scheduled this step
is preempted: its blocks are freed (they stay in the prefix cache) and it is
recomputed later, ahead of sequences not yet started; so is one when every
seat is taken and a sequence of a higher priority waits (one a step).

Lower priorities (batch lines) fill the seats the higher ones leave, except
beside them: while a sequence of a higher priority runs or waits, and for
FOREGROUND_STEPS steps after (unless the engine goes idle first), the lower ones run and are admitted up to
`max_num_seqs_background` seats only, so a step stays short for the higher
ones (their time to first token, their inter-token latency). Those running
beyond it when a higher priority arrives pause, oldest first to go on: they
keep their blocks (nothing is recomputed) and run again as the ones ahead of
them finish, or once the higher priority lapses; a higher priority that
cannot be admitted for want of blocks or an adapter slot preempts paused ones
for theirs.

A model with stateful layers (linear attention) gives each running sequence a state slot of its own, of
`max_num_seqs`, so a seat always comes with one; it goes back with the seat. Where the RoPE scales with length
past the original context, a sequence is admitted with the scale its length calls for, and one that outgrows
it (longrope) is preempted, to be recomputed (`runtime.layers.rotary.LengthScaledRope`).
"""

from collections import Counter
from dataclasses import dataclass, field

from runtime.core.block_manager import BlockManager
from runtime.core.sequence import BY_ORDER, Request, Sequence, SequenceStatus
from runtime.core.waiting_queue import WaitingQueue
from runtime.kv_tier.index import KVMove
from runtime.layers.rotary import LengthScaledRope
from runtime.lora import AdapterSlots, LoRAAdapter

FOREGROUND_STEPS = 100  # steps a higher priority keeps lower ones at their background seats after it was last seen


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)  # decodes first
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    lora_loads: list[tuple[int, LoRAAdapter]] = field(default_factory=list)  # (slot, adapter) to load first
    kv_moves: list[KVMove] = field(default_factory=list)  # copies between the KV pool and its offload tier, first

    # generating sequences whose chunk reaches their last token, so a new token is sampled
    sampled: list[Sequence] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 adapters: AdapterSlots | None = None, max_num_seqs_per_owner: int | None = None,
                 max_num_seqs_background: int | None = None, state_slots: bool = False,
                 scaled_rope: LengthScaledRope | None = None, whole_pictures: bool = False):
        self.adapters = adapters  # LoRA slots: a sequence is admitted only once its adapter has one
        self.max_num_seqs = max_num_seqs
        self.max_num_seqs_background = max_num_seqs_background or max(1, max_num_seqs // 16)
        self.max_num_batched_tokens = max_num_batched_tokens
        # an owner at this many running sequences is admitted more only when no other owner under it waits
        self.max_num_seqs_per_owner = max_num_seqs_per_owner or max(1, max_num_seqs // 2)
        self.blocks = block_manager
        self.waiting = WaitingQueue()
        self.running: list[Sequence] = []
        self.running_per_owner: Counter[str | None] = Counter()
        self.running_per_priority: Counter[int] = Counter()
        self._foreground: int | None = None  # the highest priority seen in the last FOREGROUND_STEPS steps
        self._foreground_steps = 0  # steps left before it lapses
        self.num_waiting = 0  # sequences queued still waiting (those finished while waiting leave lazily)
        self.num_preemptions = 0
        self.free_state_slots = list(range(max_num_seqs)) if state_slots else None
        self.scaled_rope = scaled_rope
        # a prefill chunk never ends inside a picture (its tokens attend both ways)
        self.whole_pictures = whole_pictures

    def add(self, request: Request) -> None:
        for seq in request.seqs:
            seq.status = SequenceStatus.WAITING
            self.waiting.push(seq)
        self.num_waiting += request.num_seqs

    def finish(self, seq: Sequence) -> None:
        """Retire a sequence (done or aborted); waiting ones leave the queue lazily."""
        if seq.status is SequenceStatus.RUNNING:
            self._stop_running(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.num_waiting -= 1
        seq.status = SequenceStatus.FINISHED
        if not self.running and not self.num_waiting:  # idle: no one left for the window to keep steps short for
            self._foreground, self._foreground_steps = None, 0

    def schedule(self) -> ScheduledBatch:
        self._see_foreground()
        self._free_a_seat()
        budget = self.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}
        preempted = False
        background_seats = self.max_num_seqs_background
        blocks, running, scaled_rope = self.blocks, SequenceStatus.RUNNING, self.scaled_rope
        # whether any running sequence is of a lower priority than the foreground (`_in_background`)
        lowest = max(self.running_per_priority, default=None)
        behind = self._foreground is not None and lowest is not None and lowest > self._foreground
        for seq, pending in self._in_order():
            if budget == 0:
                break
            if seq.status is not running or (seq.num_in_flight and seq.last_token_in_flight):
                continue  # preempted earlier in this loop, or ends when its token in flight comes back
            if scaled_rope is not None and scaled_rope.outgrown(seq.rope_scale, seq.num_tokens):
                self._preempt(seq)
                continue
            if behind and self._in_background(seq):
                if background_seats == 0:
                    continue  # paused beside the foreground
                background_seats -= 1
            if seq.draft_token_ids:
                n = self._fit_drafts(seq, budget)
            else:
                n = self._chunk(seq, seq.num_computed_tokens, min(pending, budget))
            if n == 0:
                continue  # a prompt computed whole that samples nothing: it finishes as its step completes
            while not blocks.try_grow(seq, seq.num_computed_tokens + n):
                if seq.draft_token_ids:  # short of blocks: verify nothing rather than preempt anyone
                    n -= len(seq.draft_token_ids)
                    seq.draft_token_ids = []
                    continue
                victim = max((s for s in self.running if s not in scheduled), key=BY_ORDER)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled[seq] = n
                budget -= n
        if not preempted:
            budget = self._admit(scheduled, budget)
        return self._batch(scheduled)

    def _in_order(self) -> list[tuple[Sequence, int]]:
        """The running sequences in the order they are scheduled (decodes, then unfinished prefills, each by
        priority, arrival and completion index), with their pending tokens."""
        decodes, prefills = [], []
        for seq in sorted(self.running, key=BY_ORDER):
            pending = len(seq.token_ids) + seq.num_in_flight - seq.num_computed_tokens
            if pending <= 1:
                decodes.append((seq, pending))
            else:
                prefills.append((seq, pending))
        return decodes + prefills if prefills else decodes

    def _batch(self, scheduled: dict[Sequence, int]) -> ScheduledBatch:
        """The step's batch: the sequences scheduled, one-token chunks first."""
        batch = ScheduledBatch(lora_loads=self.adapters.take_pending() if self.adapters is not None else [],
                               kv_moves=self.blocks.take_moves())
        seqs, num_new_tokens, sampled = batch.seqs, batch.num_new_tokens, batch.sampled
        longer = []
        for seq, n in scheduled.items():
            if n != 1:
                longer.append((seq, n))
                continue
            seqs.append(seq)
            num_new_tokens.append(1)
            if seq.num_pending_tokens == 1 and seq.request.samples:
                sampled.append(seq)  # (a one-token chunk verifies no draft)
        batch.num_decodes = len(seqs)
        for seq, n in longer:
            seqs.append(seq)
            num_new_tokens.append(n)
            if n == seq.num_pending_tokens + len(seq.draft_token_ids) and seq.request.samples:
                sampled.append(seq)
        return batch

    def preempt_all(self) -> None:
        """Send every running sequence back to wait, to recompute from its first token (its KV is about to go, or
        to have been computed with other weights)."""
        for seq in sorted(self.running, key=BY_ORDER, reverse=True):
            self._preempt(seq)

    def _chunk(self, seq: Sequence, start: int, n: int) -> int:
        """The tokens from `start` a prefill chunk of at most `n` runs: with `whole_pictures`, it stops before a
        picture it cannot hold whole (none, when it starts inside it)."""
        if self.whole_pictures:
            for image in seq.request.images:
                if image.offset < start + n < image.end:
                    return max(0, image.offset - start)
        return n

    def _fit_drafts(self, seq: Sequence, budget: int) -> int:
        """The tokens `seq` runs within `budget` (> 0): those pending, then the draft tokens that fit."""
        pending = seq.num_pending_tokens
        del seq.draft_token_ids[max(0, budget - pending):]
        return min(pending + len(seq.draft_token_ids), budget)

    def _free_a_seat(self) -> None:
        """Every seat taken while an owner under its cap waits: the newest sequence of the owner running the
        most, when that is over its cap, gives its seat back (preempted by recompute; its blocks stay in the
        prefix cache), so a newcomer waits a step, not until the sequences that filled the engine end. Never
        for a newcomer of lower priority; for one of a higher priority, the newest of the lowest priority gives
        its seat back whatever its owner runs. One seat a step."""
        cap = self.max_num_seqs_per_owner
        if len(self.running) < self.max_num_seqs:
            return
        seq = self.waiting.peek(self.running_per_owner, cap)
        if seq is not None and seq.priority < max(self.running_per_priority):
            self._preempt(max(self.running, key=BY_ORDER))
            return
        if seq is None or self.running_per_owner[seq.request.owner] >= cap:
            return
        owner, count = self.running_per_owner.most_common(1)[0]
        if count > cap:
            victim = max((s for s in self.running if s.request.owner == owner), key=BY_ORDER)
            if victim.priority >= seq.priority:
                self._preempt(victim)

    def _see_foreground(self) -> None:
        """The highest priority running or waiting now becomes the foreground when it is at least as high as
        the current one, or that one has lapsed."""
        now = [p for p in (min(self.running_per_priority, default=None), self.waiting.best_priority())
               if p is not None]
        self._foreground_steps -= 1
        if now and (self._foreground is None or min(now) <= self._foreground or self._foreground_steps <= 0):
            self._foreground, self._foreground_steps = min(now), FOREGROUND_STEPS
        elif self._foreground_steps <= 0:
            self._foreground = None

    def _in_background(self, seq: Sequence) -> bool:
        """`seq` is of a lower priority than the foreground (if there is one)."""
        return self._foreground is not None and seq.priority > self._foreground

    def _background_full(self, seq: Sequence) -> bool:
        """`seq` is in the background, whose sequences hold their seats already."""
        if not self._in_background(seq):
            return False
        background = sum(n for p, n in self.running_per_priority.items() if p > self._foreground)
        return background >= self.max_num_seqs_background

    def _admit(self, scheduled: dict[Sequence, int], budget: int) -> int:
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.peek(self.running_per_owner, self.max_num_seqs_per_owner)
            if seq is None or self._background_full(seq):
                break
            if self.scaled_rope is not None:
                scale = self.scaled_rope.sequence_scale(seq.num_tokens, seq.num_prompt_tokens)
                if scale != seq.rope_scale:  # its blocks hash otherwise from now on
                    seq.rope_scale, seq.block_hashes = scale, []
            hits = self.blocks.cached_prefix(seq)
            cached = len(hits) * self.blocks.block_size
            n = self._chunk(seq, cached, min(seq.num_tokens - cached, budget))
            if n == 0:
                break  # its next picture fits a later step's budget
            if not self.blocks.can_admit(hits, cached + n) or not self._pin(seq):
                if self._in_background(seq) or not self._preempt_paused(scheduled):
                    break
                continue  # a paused sequence gave its blocks and adapter slot back: try again
            self.waiting.pop(seq)
            self.num_waiting -= 1
            self.blocks.admit(seq, hits, cached + n)
            if self.free_state_slots is not None:
                seq.state_slot = self.free_state_slots.pop()
            seq.num_computed_tokens = cached
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.running_per_owner[seq.request.owner] += 1
            self.running_per_priority[seq.priority] += 1
            scheduled[seq] = n
            budget -= n
        return budget

    def _preempt_paused(self, scheduled: dict[Sequence, int]) -> bool:
        """Preempt the newest background sequence not running this step, if any, for the foreground's blocks and
        adapter slots: paused, it would hold them until it finishes."""
        paused = [s for s in self.running if s not in scheduled and self._in_background(s)]
        if not paused:
            return False
        self._preempt(max(paused, key=BY_ORDER))
        return True

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
        self._stop_running(seq)
        seq.draft_token_ids = []
        seq.speculation = None  # a draft model's keys and values went with the blocks
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.push_preempted(seq)
        self.num_waiting += 1
        self.num_preemptions += 1

    def _stop_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        self._unpin(seq)
        if seq.state_slot is not None:
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = None
        owner = seq.request.owner
        self.running_per_owner[owner] -= 1
        if not self.running_per_owner[owner]:
            del self.running_per_owner[owner]
        self.running_per_priority[seq.priority] -= 1
        if not self.running_per_priority[seq.priority]:
            del self.running_per_priority[seq.priority]
