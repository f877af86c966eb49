"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the sequence's last n tokens.

The longest suffix (from `prompt_lookup_max` down to `prompt_lookup_min` tokens) that occurred before wins.
A continuation that reaches the sequence's end goes on as an overlapping copy (the text repeats at the
distance between the two occurrences): in a run of one token, whose latest occurrence is one position back,
it proposes k more of that token, not one. Each sequence keeps an index from n-gram to where it last ended,
brought up to date with the tokens added since its last lookup, so a lookup costs O(new tokens), not O(length).
"""

from runtime.core.sequence import Sequence


class NgramIndex:
    __slots__ = ("last_end", "indexed")

    def __init__(self):
        self.last_end: dict[tuple[int, ...], int] = {}  # n-gram -> the position of its last token, latest
        self.indexed = 0  # n-grams ending before this position are in `last_end`


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.sizes = range(prompt_lookup_max, prompt_lookup_min - 1, -1)

    def propose(self, seq: Sequence, state, k: int) -> list[int]:
        """Up to `k` tokens for `seq` (`state`: its `SequenceSpeculation`), or none when no suffix recurs."""
        index, tokens = state.ngram, seq.token_ids
        last = len(tokens) - 1
        for end in range(index.indexed, last):  # every n-gram that ends before the last token
            for n in self.sizes:
                if end + 1 >= n:
                    index.last_end[tuple(tokens[end + 1 - n : end + 1])] = end
        index.indexed = max(index.indexed, last)
        for n in self.sizes:
            if last + 1 < n:
                continue
            end = index.last_end.get(tuple(tokens[last + 1 - n :]))
            if end is not None:
                return _copy(tokens, end + 1, last - end, k)
        return []

    def observe(self, step) -> None:
        """Nothing to learn from a step: proposals come from the sequence's own tokens."""

    def complete(self, seqs: list[Sequence]) -> None:
        """Nothing to do: prompt-lookup proposals are final when made."""


def _copy(tokens: list[int], start: int, distance: int, k: int) -> list[int]:
    """`k` tokens from `start` on, as if `tokens` went on repeating what lies `distance` positions back."""
    copied = tokens[start : start + k]
    while len(copied) < k:
        copied.append(copied[-distance])
    return copied
