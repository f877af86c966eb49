"""The KV offload tier's index (`kv_offloading_size`): which full blocks it holds, by prefix hash, in which of
its slots, and the copies between the pool and the tier that the coming step makes before its forward pass.

A hashed block that the pool evicts to make room is copied to a tier slot first (`store`); a prefix lookup that
misses the pool but finds the tier gets a fresh pool block and a copy back (`load`). Slots are reused least
recently used first. The tokens are kept beside the hash, and a hit is confirmed against them as a pool hit is.
The copies themselves run on every rank (`runtime.kv_tier.host_storage`), in the order they were recorded.
"""

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class TierHit:
    """A prefix block found in the tier, to be copied into a pool block as its sequence is admitted."""

    hash: int
    token_ids: tuple[int, ...]


# a copy the step makes before its forward pass: (to the tier, pool block, tier slot)
KVMove = tuple[bool, int, int]


class TierIndex:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._entries: OrderedDict[int, tuple[int, tuple[int, ...]]] = OrderedDict()  # hash -> (slot, tokens)
        self._free_slots: list[int] = []
        self.clear()
        self._pinned: set[int] = set()  # hashes being loaded by the admission under way: never evicted by it
        self._moves: list[KVMove] = []
        self.hit_tokens = 0  # prompt tokens loaded back from the tier, over its life
        self.stored_blocks = 0  # blocks copied to it, over its life

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self, block_bytes: int) -> dict:
        """What /metrics shows of the tier, its blocks being `block_bytes` each."""
        return {"kv_offload_bytes": len(self) * block_bytes, "kv_offload_capacity_bytes": self.num_slots * block_bytes,
                "kv_offload_hit_tokens": self.hit_tokens, "kv_offload_stored_blocks": self.stored_blocks}

    def holds(self, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        entry = self._entries.get(block_hash)
        return entry is not None and entry[1] == token_ids

    def holds_hash(self, block_hash: int) -> bool:  # a routing hint's test, unconfirmed by tokens
        return block_hash in self._entries

    def pin(self, hits: list[TierHit]) -> None:
        """Keep `hits` through an admission (the blocks it evicts to the tier must not take their slots)."""
        self._pinned = {hit.hash for hit in hits}
        for hit in hits:
            self._entries.move_to_end(hit.hash)

    def unpin(self) -> None:
        self._pinned = set()

    def store(self, block_hash: int, token_ids: tuple[int, ...], block_id: int) -> None:
        """The pool is about to reuse `block_id`, which holds the block `block_hash`: copy it to a slot first
        (unless the tier has it already, or every slot is pinned)."""
        if block_hash in self._entries:
            self._entries.move_to_end(block_hash)
            return
        slot = self.place(block_hash, token_ids)
        if slot is not None:
            self._moves.append((True, block_id, slot))
            self.stored_blocks += 1

    def place(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """A slot for a block that arrives from outside the pool (the shared tier), which the caller fills; None
        when the tier holds it already or every slot is pinned."""
        if block_hash in self._entries:
            return None
        slot = self._take_slot()
        if slot is not None:
            self._entries[block_hash] = (slot, token_ids)
        return slot

    def load(self, hit: TierHit, block_id: int) -> None:
        """Copy `hit` into the pool block `block_id` before the step runs."""
        slot, _ = self._entries[hit.hash]
        self._moves.append((False, block_id, slot))
        self.hit_tokens += len(hit.token_ids)

    def take_moves(self) -> list[KVMove]:
        moves, self._moves = self._moves, []
        return moves

    def clear(self) -> None:
        """Forget every block (the prefix cache was reset); the copies already recorded still run."""
        self._entries.clear()
        self._free_slots = list(range(self.num_slots - 1, -1, -1))

    def _take_slot(self) -> int | None:
        if self._free_slots:
            return self._free_slots.pop()
        for block_hash, (slot, _) in self._entries.items():  # least recently used first
            if block_hash not in self._pinned:
                del self._entries[block_hash]
                return slot
        return None
