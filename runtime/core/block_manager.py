"""Paged KV-cache block manager with hash-chained prefix caching.

Blocks are reference counted. A full block is identified by a hash that chains
its parent's hash with its own token ids, so equal hashes mean equal prefixes
(a hit is still confirmed against the stored token ids). A block whose last
user finished keeps its hash and waits among the free blocks (an LRU, and those a
request pinned: `runtime.core.free_blocks`), where a later request can hit it until
it is evicted by a fresh allocation. Every operation costs O(1) per block (a dict
lookup, an OrderedDict move or pop), a pinned one's O(log n).

With an offload tier (`runtime.kv_tier.index`), a hashed block that an allocation evicts is copied there
first, and a prefix lookup continues in the tier where the pool misses: such a hit takes a fresh block, filled
from the tier before the step runs.

When every layer of the model slides over the last `sliding_window` positions, a
running sequence's blocks that lie wholly before the window of its next query are
freed as it grows (into the LRU, still hashed); its block table keeps `FREED` in
their place so positions still map to their block index.
"""

from array import array
from hashlib import blake2b

from runtime.core.free_blocks import FreeBlocks
from runtime.core.prefix_marks import PrefixMarks
from runtime.core.sequence import Sequence
from runtime.kv_tier.index import KVMove, TierHit, TierIndex
from runtime.multimodal.inputs import ImageInput, image_hashes_in

FREED = -1  # a block-table entry whose block was freed: no attention reads it again


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 sliding_window: int | None = None, share_prefixes: bool = True, tier: TierIndex | None = None,
                 weights_version: str = ""):
        self.block_size = block_size
        # False: no sequence starts from blocks another computed, not even a sibling (a model whose layers keep
        # a state per sequence, which blocks cannot restore)
        self.share_prefixes = share_prefixes
        self.sliding_window = sliding_window  # how far back any layer reads, when every layer slides
        self.enable_prefix_caching = enable_prefix_caching
        self.tier = tier if enable_prefix_caching and share_prefixes else None
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free = FreeBlocks(num_blocks)
        self._cached: dict[int, int] = {}  # block hash -> block id
        # starts every hash chain: the same in every replica holding the same weights (runtime.models.weights_identity)
        self.weights_version = weights_version
        self.hit_tokens = 0  # prompt tokens served from cache, over the manager's life
        # recent marked prompts, for a router's view of what is cached (runtime.core.prefix_marks)
        self.prefix_marks = PrefixMarks(8 * (num_blocks + (tier.num_slots if tier is not None else 0)))
        self.queried_tokens = 0  # prompt tokens looked up

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_pinned_blocks(self) -> int:
        return self._free.num_pinned

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- admission of a sequence that holds no blocks ---------------------

    def cached_prefix(self, seq: Sequence) -> list[int | TierHit]:
        """The longest cached prefix of `seq`, leaving at least one token to compute: each block's id in the pool,
        or where only the tier holds it, a `TierHit`."""
        if seq.request.needs_every_prompt_position or not self.share_prefixes:
            return []  # prompt logprobs (mean pooling) need every prompt position's logits (hidden states)
        if not self.enable_prefix_caching and seq.request.num_seqs == 1:
            return []
        hits = []
        for i in range((seq.num_tokens - 1) // self.block_size):
            block_hash, tokens = self._hash(seq, i), self._tokens(seq, i)
            block_id = self._pooled(block_hash, tokens)
            if block_id is not None:
                hits.append(block_id)
            elif self.tier is not None and self.tier.holds(block_hash, tokens):
                hits.append(TierHit(block_hash, tokens))
            else:
                break
        return hits

    def can_admit(self, hits: list[int | TierHit], num_tokens: int) -> bool:
        """Whether `num_tokens` tokens fit when the first blocks are the cached `hits` (a tier hit takes a
        free block)."""
        pooled = [b for b in hits if not isinstance(b, TierHit)]
        revived = sum(1 for b in pooled if self.blocks[b].ref_count == 0)  # hits that leave the free LRU
        return self.blocks_for(num_tokens) - len(pooled) + revived <= len(self._free)

    def admit(self, seq: Sequence, hits: list[int | TierHit], num_tokens: int) -> None:
        """Give `seq` its cached prefix, then blocks for the rest of its first `num_tokens` tokens. The pool's
        hits are taken out of the free LRU first, so that the blocks the tier's hits fill are not among them."""
        for block_id in hits:
            if isinstance(block_id, TierHit):
                continue
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self._free.take(block_id)
            block.ref_count += 1
        tier_hits = [hit for hit in hits if isinstance(hit, TierHit)]
        if tier_hits:
            self.tier.pin(tier_hits)
            hits = [self._load(hit) if isinstance(hit, TierHit) else hit for hit in hits]
            self.tier.unpin()
        seq.block_table = list(hits)
        self._mark(seq)
        self.queried_tokens += seq.num_prompt_tokens
        self.hit_tokens += len(hits) * self.block_size
        self.grow(seq, num_tokens)

    def holds(self, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        """Whether the pool or the tier has the block `block_hash` (a read another thread may make)."""
        return self._pooled(block_hash, token_ids) is not None or (self.tier is not None
                                                                   and self.tier.holds(block_hash, token_ids))

    def prompt_hashes(self, prompt: list[int], adapter: str | None, images: tuple[ImageInput, ...] = (),
                      salt: str | None = None) -> tuple[list[int], list[tuple[int, ...]]]:
        """The hashes and tokens of `prompt`'s full blocks but its last token's (which is always computed), chained
        as its admission would chain them."""
        tokens = full_blocks(prompt, self.block_size)
        return hash_chain(self.chain_start(adapter, salt=salt), prompt, self.block_size, images, 0, len(tokens)), tokens

    def held_prefix(self, hashes: list[int], tokens: list[tuple[int, ...]]) -> int:
        """How many of a prompt's blocks (`prompt_hashes`), from the first, the pool or the tier holds (a read
        another thread may make)."""
        held = 0
        while held < len(hashes) and self.holds(hashes[held], tokens[held]):
            held += 1
        return held

    def _mark(self, seq: Sequence) -> None:
        """Keep the request's prefix marks with its prompt's block hashes, as admission chains them (and memoises
        them on the sequence for its lookups and commits): `held_marks` answers which are held."""
        marks = seq.request.prefix_marks
        if marks and self.enable_prefix_caching and self.share_prefixes:
            full = (seq.request.num_prompt_tokens - 1) // self.block_size
            self.prefix_marks.track(self.prefix_hashes(seq, full), marks)

    def held_marks(self) -> list[int]:
        """The marks of kept prompts whose prefixes the pool or the tier holds (a read another thread may make)."""
        return self.prefix_marks.held(self._holds_hash)

    def _holds_hash(self, block_hash: int) -> bool:
        return block_hash in self._cached or (self.tier is not None and self.tier.holds_hash(block_hash))

    def prefix_hashes(self, seq: Sequence, count: int) -> list[int]:
        """The hashes of `seq`'s first `count` blocks, as its admission computed them."""
        return [self._hash(seq, i) for i in range(count)]

    def take_moves(self) -> list[KVMove]:
        """The copies between the pool and the tier that the coming step makes before its forward pass."""
        return self.tier.take_moves() if self.tier is not None else []

    # --- growth of a running sequence --------------------------------------

    def try_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """`grow`, when the free blocks suffice; False (and nothing changed) when they do not."""
        new_blocks = self.blocks_for(num_tokens) - len(seq.block_table)
        if new_blocks > len(self._free):
            return False
        if new_blocks > 0 or min(num_tokens, len(seq.token_ids)) // self.block_size > seq.num_committed_blocks \
                or self.sliding_window is not None:
            self.grow(seq, num_tokens)
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Cover the first `num_tokens` tokens of `seq`, all of which are computed by the coming step.

        Blocks that become full are registered in the prefix cache now: within
        the step, every layer stores all new K/V before any attention reads it,
        so a sequence admitted in the same step may already share them. Draft
        tokens past the sequence's own are covered but never registered.
        """
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._take_free())
        full = min(num_tokens, seq.num_tokens) // self.block_size
        for i in range(seq.num_committed_blocks, full):
            self._commit(seq, i)
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)
        if self.sliding_window is not None:
            self._free_before_window(seq)

    def shrink(self, seq: Sequence, num_tokens: int) -> None:
        """Release the blocks past `seq`'s first `num_tokens` tokens (slots of rejected draft tokens). They were
        never registered, so they go to the front of the free list, to be reused first."""
        while len(seq.block_table) > self.blocks_for(num_tokens):
            block_id = seq.block_table.pop()
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.release(block_id, front=True)

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks, tail first so that shared heads are evicted last. The whole blocks of the prompt
        prefix its request pins (`SamplingParams.pin_prefix_tokens`) are kept in preference for the pin's time."""
        params = seq.params
        if params.pin_prefix_tokens and self.enable_prefix_caching:
            pinned = min(params.pin_prefix_tokens // self.block_size, seq.num_committed_blocks)
            for block_id in reversed(seq.block_table[:pinned]):  # tail first: over the cap, tails go first
                if block_id != FREED:
                    self._free.pin(block_id, seq.request.owner, params.pin_ttl_s)
        for block_id in reversed(seq.block_table):
            if block_id != FREED:
                self._release(block_id)
        seq.block_table = []
        seq.num_committed_blocks = 0

    def forget_pictures(self, request) -> None:
        """Take the hashes off the blocks of a request with pictures, so that no later prompt hits them (a failed
        request's: its pictures' encoding may have failed, and their KV holds placeholders)."""
        if not request.images:
            return
        for seq in request.seqs:
            for block_id in seq.block_table:
                block = self.blocks[block_id] if block_id != FREED else None
                if block is not None and block.hash is not None:
                    if self._cached.get(block.hash) == block_id:
                        del self._cached[block.hash]
                    block.hash, block.token_ids = None, None
            seq.num_committed_blocks = 0

    def forget_cached(self) -> None:
        """Drop the prefix cache and its hit counts, as a new manager has none; every block must be free."""
        if len(self._free) != len(self.blocks):
            raise AssertionError(f"{len(self.blocks) - len(self._free)} blocks still held")
        for block in self.blocks:
            block.hash = block.token_ids = None
        self._cached.clear()
        self._free.unpin_all()
        self.hit_tokens = self.queried_tokens = 0
        if self.tier is not None:
            self.tier.clear()

    def new_weights(self, version: str) -> None:
        """The weights changed (to `version`): every prefix's chain starts anew, and the cached ones are forgotten
        (the engine recomputes every sequence, its memoised hashes dropped)."""
        self.weights_version = version
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (the weights stay: a block computed later under the same chain is hit)."""
        for block in self.blocks:
            block.hash = block.token_ids = None
        self._cached.clear()
        self._free.unpin_all()
        if self.tier is not None:
            self.tier.clear()

    # --- internals -----------------------------------------------------------

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count < 0:
            raise AssertionError(f"block {block_id} freed twice")
        if block.ref_count == 0:
            self._free.release(block_id)

    def _free_before_window(self, seq: Sequence) -> None:
        """Free the blocks wholly before the window of the coming step's first query (position
        num_computed_tokens sees from num_computed_tokens - window + 1 on); newest first, stopping at the
        first one already freed, so each block is visited once."""
        first_seen = seq.num_computed_tokens - self.sliding_window + 1
        for index in range(first_seen // self.block_size - 1, -1, -1):
            if seq.block_table[index] == FREED:
                break
            self._release(seq.block_table[index])
            seq.block_table[index] = FREED

    def _take_free(self) -> int:
        block_id = self._free.pop()
        block = self.blocks[block_id]
        if block.hash is not None and self._cached.get(block.hash) == block_id:
            del self._cached[block.hash]
            if self.tier is not None:
                self.tier.store(block.hash, block.token_ids, block_id)
        block.hash = block.token_ids = None
        block.ref_count = 1
        return block_id

    def _pooled(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """The pool's block of hash `block_hash`, confirmed by its tokens, or None."""
        block_id = self._cached.get(block_hash)
        return block_id if block_id is not None and self.blocks[block_id].token_ids == token_ids else None

    def _load(self, hit: TierHit) -> int:
        """A free block that the tier's copy of `hit` fills, registered as the pool's copy of it."""
        block_id = self._take_free()
        block = self.blocks[block_id]
        block.hash, block.token_ids = hit.hash, hit.token_ids
        self._cached[hit.hash] = block_id
        self.tier.load(hit, block_id)
        return block_id

    def _commit(self, seq: Sequence, index: int) -> None:
        block = self.blocks[seq.block_table[index]]
        if block.hash is not None:
            return  # a cache hit: already registered
        block.hash = self._hash(seq, index)
        block.token_ids = self._tokens(seq, index)
        self._cached.setdefault(block.hash, block.block_id)

    def _tokens(self, seq: Sequence, index: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])

    def chain_start(self, adapter: str | None, rope_scale: float | None = None, salt: str | None = None) -> str:
        """Where a prefix's hash chain starts: the weights' version and the LoRA adapter (the same tokens under
        other weights or another adapter have other keys and values), a length-scaled RoPE's scale (rotated
        otherwise, its blocks never match a sequence rotated by another), and the request's cache salt (a tenant's:
        no other tenant's request hits its blocks, in the pool or any tier)."""
        return f"{self.weights_version}|{adapter}" + (f"|rope scale {rope_scale}" if rope_scale else "") + \
            (f"|salt {salt}" if salt else "")

    def _hash(self, seq: Sequence, index: int) -> int:
        """Hash of block `index` of `seq`, chained from its parent's (memoised on the sequence). Without prefix
        caching only siblings (n > 1) share: the chain starts at the request."""
        hashes = seq.block_hashes
        if len(hashes) <= index:
            adapter = seq.request.adapter
            parent = hashes[-1] if hashes else self.chain_start(adapter.name if adapter is not None else None,
                                                                seq.rope_scale, seq.params.cache_salt) \
                if self.enable_prefix_caching else f"request {seq.request.request_id}"
            hashes += hash_chain(parent, seq.token_ids, self.block_size, seq.request.images, len(hashes), index + 1)
        return hashes[index]


def full_blocks(prompt: list[int], block_size: int) -> list[tuple[int, ...]]:
    """The tokens of `prompt`'s full blocks but its last token's."""
    return [tuple(prompt[i * block_size : (i + 1) * block_size]) for i in range((len(prompt) - 1) // block_size)]


def hash_chain(parent: int | str, token_ids: list[int], block_size: int, images: tuple[ImageInput, ...],
               first: int, end: int) -> list[int]:
    """The hashes of blocks `first` .. `end` - 1 of `token_ids`, chained from `parent` (block `first` - 1's hash,
    or where the chain starts)."""
    hashes = []
    for i in range(first, end):
        pictures = image_hashes_in(images, i * block_size, (i + 1) * block_size) if images else ()
        parent = block_hash(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), pictures)
        hashes.append(parent)
    return hashes


def block_hash(parent: int | str, token_ids: tuple[int, ...], pictures: tuple[int, ...] = ()) -> int:
    """A block's hash from its parent's (or the chain's start), its tokens and the content hashes of the pictures
    whose tokens it holds (their placeholder tokens are the same whatever the picture): the same in every process
    (a replica sharing blocks with another computes the same keys), unlike Python's `hash` of a string."""
    digest = blake2b(str(parent).encode(), digest_size=8)
    digest.update(array("q", token_ids).tobytes())
    if pictures:
        digest.update(array("Q", pictures).tobytes())
    return int.from_bytes(digest.digest(), "little")
