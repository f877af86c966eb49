"""The KV tier shared by the engines of a cluster (`kv_shared_tier`): prompts' full blocks, published by the
engine that computed them into Ray's object store, and found by any engine of the same tier name through one
directory actor, keyed by the blocks' chained hashes (the same in every process holding the same weights: the
chain starts from their version) and confirmed by their tokens.

An engine publishes a prompt's blocks once its prefill ends (prompts of at least `min_prompt_tokens`): they are
read out of the KV pool and put in the object store off the engine's thread. Before a request is queued, the
engine asks the directory for the longest run of its prompt's blocks that it lacks, fetches them and writes them
into its offload tier, where the admission finds them as its own. Objects live in their publisher's store: when
it dies they are lost and the others recompute what they cannot fetch. The directory drops the least recently
used blocks past its bytes; when its own process or node dies, Ray restarts it empty, and prompts fill it again.
No lookup or fetch waits on a dead node for long: past `LOOKUP_TIMEOUT_S` or `FETCH_TIMEOUT_S` the engine
computes the prompt itself.
"""

import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ray
import torch

from runtime.config import SharedTierConfig
from runtime.core.block_manager import BlockManager, full_blocks
from runtime.multimodal.inputs import ImageInput

logger = logging.getLogger(__name__)

DIRECTORY_PREFIX = "kv-shared-tier-"
LOOKUP_TIMEOUT_S = 2.0  # the directory's answer: a small message
FETCH_TIMEOUT_S = 10.0  # the blocks themselves, from their publisher's node


@dataclass
class FetchedBlocks:
    """Blocks found in the shared tier for one prompt, to be written into the offload tier."""

    hashes: list[int]
    token_ids: list[tuple[int, ...]]
    data: list[torch.Tensor]  # each [planes, layers, block_size, kv heads, head size]

    def place(self, blocks: BlockManager, host_tier) -> None:
        """Write the blocks the engine lacks into its offload tier (`host_tier`, the slots' storage), where an
        admission finds them."""
        for block_hash, tokens, data in zip(self.hashes, self.token_ids, self.data):
            if blocks.holds(block_hash, tokens):
                continue
            slot = blocks.tier.place(block_hash, tokens)
            if slot is not None:
                host_tier.write(slot, data)


@ray.remote(num_cpus=0, max_restarts=-1)
class KVDirectory:
    """Block hash -> (its tokens, the published object holding it, its index there), least recently used first."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.entries: OrderedDict[int, tuple[tuple[int, ...], list, int, int]] = OrderedDict()
        self.bytes = 0

    def publish(self, hashes: list[int], token_ids: list[tuple[int, ...]], boxed: list, block_bytes: int) -> int:
        """Blocks `hashes` of one published object (`boxed[0]`, its ObjectRef, boxed so Ray passes the reference);
        how many of them the directory holds after it has made room."""
        for index, (key, tokens) in enumerate(zip(hashes, token_ids)):  # the newest copy of a block wins
            old = self.entries.pop(key, None)
            self.bytes += block_bytes - (old[3] if old is not None else 0)
            self.entries[key] = (tokens, boxed, index, block_bytes)
        while self.bytes > self.capacity and self.entries:
            *_, dropped = self.entries.popitem(last=False)[1]
            self.bytes -= dropped
        return sum(key in self.entries and self.entries[key][1] is boxed for key in hashes)

    def lookup(self, hashes: list[int]) -> list[tuple[tuple[int, ...], list, int]]:
        """The longest run of `hashes`, from the first, that the tier holds: (tokens, boxed ref, index) each."""
        found = []
        for key in hashes:
            entry = self.entries.get(key)
            if entry is None:
                break
            self.entries.move_to_end(key)
            found.append(entry[:3])
        return found

    def forget(self, hashes: list[int], lost: list) -> None:
        """Blocks held in the objects `lost` (their publisher died); a copy published since stays."""
        for key in hashes:
            entry = self.entries.get(key)
            if entry is not None and entry[1][0] in lost:
                del self.entries[key]
                self.bytes -= entry[3]

    def stats(self) -> dict:
        return {"blocks": len(self.entries), "bytes": self.bytes}


class SharedTier:
    """An engine's side of the shared tier: what it publishes, and the blocks it fetches for a prompt."""

    def __init__(self, config: SharedTierConfig, default_name: str, block_manager: BlockManager, block_bytes: int):
        self.config = config
        self.blocks, self.block_bytes = block_manager, block_bytes
        name = DIRECTORY_PREFIX + (config.name or default_name).replace("/", "_")
        self.directory = KVDirectory.options(name=name, namespace="rayllm", get_if_exists=True,
                                             lifetime="detached").remote(int(config.size_gib * 2**30))
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="kv-publish")
        self.published_blocks = self.fetched_blocks = 0

    def stats(self) -> dict:
        return {"kv_shared_published_blocks": self.published_blocks, "kv_shared_fetched_blocks": self.fetched_blocks}

    def publish(self, prompt: list[int], prefix_hashes, read_blocks, block_ids: list[int]) -> None:
        """A prompt whose prefill just ended: its full blocks (`block_ids`, read by `read_blocks`) into the tier,
        under the hashes its admission gave them (`prefix_hashes(count)`)."""
        if len(prompt) < self.config.min_prompt_tokens:
            return
        tokens = full_blocks(prompt, self.blocks.block_size)
        hashes = prefix_hashes(len(tokens))
        data = read_blocks(block_ids[: len(tokens)])  # before the pool reuses them
        self._publisher.submit(self._put, hashes, tokens, data)

    def _put(self, hashes, tokens, data: torch.Tensor) -> None:
        try:
            self.published_blocks += ray.get(self.directory.publish.remote(hashes, tokens, [ray.put(data)],
                                                                           self.block_bytes), timeout=LOOKUP_TIMEOUT_S)
        except Exception:  # the tier is an optimisation: an engine serves on without it
            logger.exception("publishing %d KV blocks to the shared tier failed", len(hashes))

    def fetch(self, prompt: list[int], adapter: str | None, images: tuple[ImageInput, ...] = (),
              salt: str | None = None) -> FetchedBlocks | None:
        """The blocks of `prompt` that the tier has past those the engine holds already, each confirmed by its
        tokens. Prompts under `min_prompt_tokens` are not looked up (nor published): a round trip saved."""
        if len(prompt) < self.config.min_prompt_tokens:
            return None
        hashes, tokens = self.blocks.prompt_hashes(prompt, adapter, images, salt)
        held = self.blocks.held_prefix(hashes, tokens)
        hashes, tokens = hashes[held:], tokens[held:]
        if not hashes:
            return None
        try:
            found = ray.get(self.directory.lookup.remote(hashes), timeout=LOOKUP_TIMEOUT_S)
            confirmed = 0
            while confirmed < len(found) and tuple(found[confirmed][0]) == tokens[confirmed]:
                confirmed += 1
            found = found[:confirmed]
            if not found:
                return None
            refs = list(dict.fromkeys(boxed[0] for _, boxed, _ in found))
            values = dict(zip(refs, ray.get(refs, timeout=FETCH_TIMEOUT_S)))
        except ray.exceptions.ObjectLostError:  # its publisher died (OwnerDiedError is one)
            self.directory.forget.remote(hashes, refs)
            return None
        except ray.exceptions.RayError as e:  # the tier is an optimisation: the prompt is computed here instead
            logger.warning("fetching KV blocks from the shared tier failed (%r): the prompt is computed", e)
            return None
        data = [values[boxed[0]][:, :, index] for _, boxed, index in found]
        self.fetched_blocks += len(found)
        return FetchedBlocks(hashes[: len(found)], tokens[: len(found)], data)

    def flush(self) -> None:
        """Wait until the directory holds the blocks being published (or their publishing failed)."""
        self._publisher.submit(lambda: None).result()

    def shutdown(self) -> None:
        self._publisher.shutdown(wait=True)
