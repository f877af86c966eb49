"""The pool's free blocks: unpinned ones taken least recently freed first, pinned ones only after them (earliest
expiry first), an expired pin's block first of all, and no owner pinning more than its share."""

from runtime.core.free_blocks import FreeBlocks


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def held(free: FreeBlocks, count: int) -> list[int]:
    return [free.pop() for _ in range(count)]


def test_pinned_blocks_are_taken_after_every_unpinned_one_earliest_expiry_first():
    clock = Clock()
    free = FreeBlocks(8, clock)
    blocks = held(free, 8)
    free.pin(blocks[0], "a", ttl_s=100)
    free.pin(blocks[1], "b", ttl_s=50)
    for block_id in blocks:
        free.release(block_id)
    assert len(free) == 8 and free.num_pinned == 2
    assert held(free, 8) == [*blocks[2:], blocks[1], blocks[0]]
    assert free.num_pinned == 0  # a pinned block taken for another prefix loses its pin


def test_an_expired_pin_leaves_its_block_first_in_line():
    clock = Clock()
    free = FreeBlocks(4, clock)
    blocks = held(free, 4)
    free.pin(blocks[3], "a", ttl_s=10)
    for block_id in blocks:
        free.release(block_id)
    clock.now = 11
    assert free.pop() == blocks[3] and free.num_pinned == 0
    free.pin(blocks[3], "a", ttl_s=10)
    free.release(blocks[3])
    clock.now = 30  # its pin expired while it was held
    free.take(blocks[0])
    free.release(blocks[0])  # now the LRU's last
    assert held(free, 4) == [blocks[3], blocks[1], blocks[2], blocks[0]]


def test_a_block_hit_again_keeps_its_pin_and_an_owner_pins_at_most_its_share():
    clock = Clock()
    free = FreeBlocks(8, clock)  # a quarter: 2 blocks an owner
    blocks = held(free, 8)
    for block_id in blocks[:3]:
        free.pin(block_id, "a", ttl_s=100)
    free.pin(blocks[3], "b", ttl_s=100)
    assert free.num_pinned == 3  # a's first pin went
    for block_id in blocks:
        free.release(block_id)
    free.take(blocks[1])  # a prefix hit on a pinned block
    free.release(blocks[1])
    assert held(free, 8) == [blocks[0], *blocks[4:], blocks[1], blocks[2], blocks[3]]
