"""The KV offload tier's storage on a rank: its KV heads' share of each offloaded block, in host memory (pinned
on a GPU, so copies run at the link's speed), beside the pool; and the copies the step makes before its forward
pass (`runtime.kv_tier.index` records them). On a CPU the tier is plain memory outside the pool's budget: a
block that leaves the pool's LRU stays one copy away instead of a recomputation."""

import torch

from runtime.kv_tier.index import KVMove


class HostKVTier:
    def __init__(self, num_bytes: int, kv_cache: torch.Tensor):
        """As many slots as `num_bytes` holds of `kv_cache`'s blocks ([planes, layers, blocks, ...])."""
        planes, layers, _, *block = kv_cache.shape
        block_bytes = planes * layers * kv_cache[0, 0, 0].numel() * kv_cache.element_size()
        self.num_slots = num_bytes // block_bytes
        self.block_bytes = block_bytes
        pinned = kv_cache.is_cuda
        self.slots = torch.empty((planes, layers, self.num_slots, *block), dtype=kv_cache.dtype, pin_memory=pinned)

    def write(self, slot: int, block: torch.Tensor) -> None:
        """A block from elsewhere ([planes, layers, block_size, kv heads, head size]) into `slot`."""
        _bytes(self.slots)[:, :, slot] = _bytes(block.to(self.slots.dtype))

    def apply(self, moves: list[KVMove], kv_cache: torch.Tensor) -> None:
        """Make `moves` in their order: runs of one direction at once, a run ending where it would touch a block
        or slot twice."""
        pool, tier = _bytes(kv_cache), _bytes(self.slots)
        for to_tier, blocks, slots in _runs(moves):
            if to_tier:
                tier[:, :, torch.tensor(slots)] = pool[:, :, torch.tensor(blocks, device=kv_cache.device)].cpu()
            else:
                pool[:, :, torch.tensor(blocks, device=kv_cache.device)] = \
                    tier[:, :, torch.tensor(slots)].to(kv_cache.device, non_blocking=True)


def read_blocks(kv_cache: torch.Tensor, block_ids: list[int]) -> torch.Tensor:
    """The pool's blocks `block_ids` on the host, [planes, layers, blocks, block_size, kv heads, head size]."""
    index = torch.tensor(block_ids, device=kv_cache.device)
    return _bytes(kv_cache)[:, :, index].cpu().view(kv_cache.dtype)


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    """`cache` as bytes (torch indexes no FP8 tensor on CPU)."""
    return cache.view(torch.uint8)


def _runs(moves: list[KVMove]) -> list[tuple[bool, list[int], list[int]]]:
    runs: list[tuple[bool, list[int], list[int]]] = []
    for to_tier, block, slot in moves:
        if not runs or runs[-1][0] != to_tier or block in runs[-1][1] or slot in runs[-1][2]:
            runs.append((to_tier, [], []))
        runs[-1][1].append(block)
        runs[-1][2].append(slot)
    return runs
