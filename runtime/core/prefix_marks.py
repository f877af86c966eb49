"""Which prefixes of recent prompts the engine still holds, named by marks its caller chose.

A request may carry marks (`ValidRequest.prefix_marks`): labels for evenly spaced prefixes of its prompt, mark i of
n standing for the prompt's first (i + 1) / n. The block manager keeps the block hashes of recent marked prompts, as
it chains them when it admits them (bounded in blocks, the least recently admitted dropped first; a prompt that
extends a kept one, as an agent's next turn extends its last, replaces it) and answers which marks' prefixes the
pool or the offload tier still holds: of a prompt's marks up to the share of its blocks held from its first, the
deepest and those at powers of two (the 1st, 2nd, 4th, ...), so that a report stays a few marks a prompt however
long it is, and a request sharing only the start of a kept prompt still finds a mark near where they part. That is
how a replica tells its router what its prefix cache holds in the router's own terms (deployments/route_marks.py),
without the router tokenizing a prompt. It is a routing hint: the held share is found by bisection, as if a chain's
blocks were evicted from its end, and a hash is not confirmed by its tokens.
"""

from collections import OrderedDict
from collections.abc import Callable


class PrefixMarks:
    def __init__(self, max_blocks: int):
        self.max_blocks = max_blocks
        self._prompts: OrderedDict[int, tuple[list[int], tuple[int, ...]]] = OrderedDict()  # last hash -> kept
        self._blocks = 0

    def __len__(self) -> int:
        return len(self._prompts)

    def track(self, hashes: list[int], marks: tuple[int, ...]) -> None:
        """Keep a prompt's block hashes (`BlockManager.prompt_hashes`) and its marks."""
        if not hashes or not marks:
            return
        for block_hash in hashes:  # the kept prompts this one extends (or repeats)
            extended = self._prompts.pop(block_hash, None)
            if extended is not None:
                self._blocks -= len(extended[0])
        self._prompts[hashes[-1]] = (hashes, marks)
        self._blocks += len(hashes)
        while self._blocks > self.max_blocks and len(self._prompts) > 1:
            self._blocks -= len(self._prompts.popitem(last=False)[1][0])

    def held(self, holds: Callable[[int], bool]) -> list[int]:
        """The marks whose prefixes are held, `holds` saying whether a block hash is (any thread may ask: the
        kept prompts are copied under the interpreter lock first)."""
        held: set[int] = set()
        for hashes, marks in list(self._prompts.values()):
            low, high = 0, len(hashes)  # the held blocks from the first: hashes[:low]
            while low < high:
                middle = (low + high + 1) // 2
                if holds(hashes[middle - 1]):
                    low = middle
                else:
                    high = middle - 1
            depth = len(marks) * low // len(hashes)
            if depth:
                held.add(marks[depth - 1])
                held.update(marks[(1 << i) - 1] for i in range(depth.bit_length()))
        return list(held)
