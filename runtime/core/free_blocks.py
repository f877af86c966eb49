"""The KV pool's free blocks, in the order allocation takes them, with pins that keep cached prefixes longest.

A block freed with no pin joins an LRU: allocation takes the least recently freed first. A request may pin its
prompt's first blocks for a while (the prefix up to a client's cache mark, for its TTL: Anthropic's
`cache_control`); a block freed under a live pin waits apart, and allocation takes such blocks only once no
unpinned one is left, the earliest expiring first. A pin that expires leaves its block at the front of the LRU.
Pinning is a preference, never a reservation: every free block, pinned or not, can be allocated. Each owner (an
API key) holds at most PIN_SHARE of the pool pinned; a pin past it unpins that owner's oldest, so a prefix is
pinned tail first (a prefix whose head goes is never hit, whatever of it stays).
"""

import heapq
import itertools
import time
from collections import OrderedDict

PIN_SHARE = 0.25  # of the pool's blocks, the most one owner keeps pinned


class FreeBlocks:
    def __init__(self, num_blocks: int, clock=time.monotonic):
        self.clock = clock
        self.per_owner = max(1, int(num_blocks * PIN_SHARE))
        self._lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # unpinned, oldest first
        self._pinned: dict[int, float] = {}  # free and pinned: block id -> when its pin expires
        self._expiry: list[tuple[float, int, int]] = []  # heap of (expiry, tie, block id); stale entries skipped
        self._tie = itertools.count()
        self._pins: dict[int, tuple[str | None, float]] = {}  # every pinned block, free or held: (owner, expiry)
        self._by_owner: dict[str | None, OrderedDict[int, None]] = {}  # each owner's pinned blocks, oldest first

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._lru or block_id in self._pinned

    @property
    def num_pinned(self) -> int:
        """Blocks under a live pin, free or held."""
        now = self.clock()
        return sum(1 for _, expiry in self._pins.values() if expiry > now)

    def pin(self, block_id: int, owner: str | None, ttl_s: float) -> None:
        """Keep `block_id` (held now, freed later) in preference for `ttl_s` seconds from now, or as long as a pin
        it has already."""
        expiry = self.clock() + ttl_s
        if block_id in self._pins:
            expiry = max(expiry, self._pins[block_id][1])
            self._unpin(block_id)
        self._pins[block_id] = (owner, expiry)
        pinned = self._by_owner.setdefault(owner, OrderedDict())
        pinned[block_id] = None
        if len(pinned) > self.per_owner:
            oldest = next(iter(pinned))
            self._unpin(oldest)
            if self._pinned.pop(oldest, None) is not None:
                self._lru[oldest] = None
                self._lru.move_to_end(oldest, last=False)

    def release(self, block_id: int, front: bool = False) -> None:
        """`block_id` is free: apart if a live pin holds it, else at the LRU's end (its front: taken first)."""
        pin = self._pins.get(block_id)
        if pin is not None and pin[1] > self.clock():
            self._pinned[block_id] = pin[1]
            heapq.heappush(self._expiry, (pin[1], next(self._tie), block_id))
            if len(self._expiry) > 2 * len(self._pinned) + 64:  # mostly stale: blocks taken since (prefix hits)
                self._expiry = [entry for entry in self._expiry if self._pinned.get(entry[2]) == entry[0]]
                heapq.heapify(self._expiry)
            return
        if pin is not None:
            self._unpin(block_id)
        self._lru[block_id] = None
        if front:
            self._lru.move_to_end(block_id, last=False)

    def take(self, block_id: int) -> None:
        """A free block is in use again (a prefix hit on it); its pin stays."""
        if self._pinned.pop(block_id, None) is None:
            del self._lru[block_id]

    def pop(self) -> int:
        """The block to allocate next: the LRU's oldest, or the pinned one whose pin expires first. Its pin goes."""
        self._expire()
        if self._lru:
            block_id, _ = self._lru.popitem(last=False)
            return block_id
        while True:
            expiry, _, block_id = heapq.heappop(self._expiry)
            if self._pinned.get(block_id) == expiry:
                del self._pinned[block_id]
                self._unpin(block_id)
                return block_id

    def unpin_all(self) -> None:
        """Every pin goes (the cached prefixes were forgotten); their free blocks join the LRU's front."""
        for block_id in list(self._pinned):
            self._lru[block_id] = None
            self._lru.move_to_end(block_id, last=False)
        self._pinned.clear()
        self._expiry.clear()
        self._pins.clear()
        self._by_owner.clear()

    def _expire(self) -> None:
        """Blocks whose pins have expired join the LRU's front."""
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            expiry, _, block_id = heapq.heappop(self._expiry)
            if self._pinned.get(block_id) == expiry:
                del self._pinned[block_id]
                self._unpin(block_id)
                self._lru[block_id] = None
                self._lru.move_to_end(block_id, last=False)

    def _unpin(self, block_id: int) -> None:
        """Forget `block_id`'s pin; where it waits when free is the caller's to say."""
        owner, _ = self._pins.pop(block_id)
        pinned = self._by_owner[owner]
        del pinned[block_id]
        if not pinned:
            del self._by_owner[owner]
