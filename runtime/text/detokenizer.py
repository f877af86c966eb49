"""Incremental detokenization with stop strings and streaming holdback.

Text is decoded over a short sliding window of token ids, so each step costs
O(window), and new text is only released once it no longer ends in U+FFFD,
i.e. never half of a multi-byte UTF-8 character. With no stop string or
regex to look for, tokens are decoded only when text is released, all those
appended since in one window: a request whose caller reads only its final
text is decoded once, not twice per token. Stop strings are searched in
the text as it grows (so they match across token boundaries); text that could
still turn out to be the start of a stop string is held back from the stream
until it is resolved. Both follow each stop string with a Knuth-Morris-Pratt
automaton whose state is the longest prefix of the stop that the text ends
with, so each token costs time in its new text (amortized; at most the new
text plus the stop's length), never in the output's or the stop's length
squared: the state is the hold-back, and reaching the stop's length is a match.
Stop regexes (SGLang's `stop_regex`) are searched with
RE2, whose time is linear in the text, so no pattern can stall the engine:
after each token, only in the tail that a new match could span when the
pattern's longest match is bounded (as SGLang bounds it), in the whole output
when it is not (`+`, `*`). The matched text stays in the output (a regex
match cannot be held back from a stream the way a literal's prefix can).
"""

import re._constants
import re._parser
from functools import lru_cache

import re2
from transformers import PreTrainedTokenizerBase

_PROMPT_CONTEXT = 5  # prompt tokens decoded with the first outputs, for correct spacing


@lru_cache(maxsize=256)
def stop_pattern(pattern: str) -> "re2._Regexp":
    """A compiled stop regex (RE2 syntax); raises ValueError for one RE2 cannot compile."""
    try:
        return re2.compile(pattern)
    except re2.error as e:
        raise ValueError(f"not an RE2 regex: {e}") from None


@lru_cache(maxsize=256)
def longest_match(pattern: str) -> int | None:
    """The most characters a match can span, by Python's regex parser; None when unbounded or unparsed (RE2
    syntax Python lacks, such as \\pL). Never less than the pattern's own length: where RE2 reads as literal
    what Python reads as a repeat (`a{,3}`), the match is at most the pattern's text."""
    try:
        longest = re._parser.parse(pattern).getwidth()[1]
    except (re.error, OverflowError, RecursionError):
        return None
    return max(longest, len(pattern)) if longest < re._constants.MAXREPEAT else None


@lru_cache(maxsize=1024)
def borders(stop: str) -> tuple[int, ...]:
    """KMP's failure function: entry i is the length of the longest proper prefix of `stop` that
    `stop[:i + 1]` ends with (time linear in the stop)."""
    table = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = table[k - 1]
        if stop[i] == stop[k]:
            k += 1
        table[i] = k
    return tuple(table)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        stop: list[str],
        include_stop_str_in_output: bool,
        skip_special_tokens: bool,
        stop_regex: list[str] = (),
    ):
        self.tokenizer = tokenizer
        self.stop = stop
        self._borders = [borders(s) for s in stop]
        self._matched = [0] * len(stop)  # per stop: the longest prefix of it that `text` ends with (below its length)
        self.stop_regex = [(pattern, stop_pattern(pattern), longest_match(pattern)) for pattern in stop_regex]
        self.include_stop = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # output text so far (truncated at a matched stop string)
        self._emitted = 0  # characters of `text` already released
        # a fast tokenizer's Rust decoder, called directly: transformers' wrapper around it costs several times the
        # decode itself, and a step decodes twice per sequence
        backend = getattr(tokenizer, "_tokenizer", None)
        self._backend = None if getattr(tokenizer, "clean_up_tokenization_spaces", False) else backend

    def append(self, token_id: int, check_stop: bool = True) -> str | None:
        """Add a generated token; returns the stop string (or stop regex) it completed, if any. With nothing to
        look for, the token is decoded only when text is released, with the others appended since."""
        self._ids.append(token_id)
        if not self.stop and not self.stop_regex:
            return None
        checked = len(self.text)
        new = self._catch_up()
        if not new:
            return None
        found = self._advance_stops(checked, new) if self.stop else None  # the automata see all text, checked or not
        if not check_stop:
            return None
        if found is None:
            return self._find_stop_regex(checked)
        pos, stop = found
        self.text = self.text[: pos + len(stop) if self.include_stop else pos]
        self._read_offset = len(self._ids)  # nothing after the stop is text, not even a tail held back
        return stop

    def _find_stop_regex(self, checked: int) -> str | None:
        """A match not found before this token ends in its text, so it starts at most `longest` characters before.
        That tail is searched as a slice with one character before it, which `\\b` and `(?m)^` look at (a search
        from an offset into the whole text would cost RE2's wrapper a pass over all of it)."""
        for pattern, compiled, longest in self.stop_regex:
            start = 0 if longest is None else max(0, checked - longest)
            if compiled.search(self.text[start - 1:], 1) if start else compiled.search(self.text):
                return pattern
        return None

    def _advance_stops(self, checked: int, new: str) -> tuple[int, str] | None:
        """Advance every stop's automaton over `new` (which starts at `checked` in `text`); the start and the stop
        string of the match that starts first among those ending in `new` (the earlier listed on a tie)."""
        best = None
        for i, (s, table) in enumerate(zip(self.stop, self._borders)):
            k, end = self._matched[i], None
            for j, c in enumerate(new):
                while k and s[k] != c:
                    k = table[k - 1]
                if s[k] == c:
                    k += 1
                    if k == len(s):
                        end = checked + j + 1 if end is None else end
                        k = table[k - 1]
            self._matched[i] = k
            if end is not None and (best is None or end - len(s) < best[0]):
                best = (end - len(s), s)
        return best

    def _catch_up(self, final: bool = False) -> str:
        """Decode the tokens appended since the last decode, over a window that starts a decode before them (for
        correct spacing); their text, added to `text`. Tokens that end in an incomplete character wait for more
        bytes (the text goes up to the last of them that ends a character) unless no more will come: then bytes
        that never formed a character are text as the tokenizer decodes them, replacement characters. A token
        without text (a skipped special token, an id the tokenizer lacks) moves the window on."""
        end = len(self._ids)
        if self._read_offset == end:
            return ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        while (full := self._decode(self._ids[self._prefix_offset : end])).endswith("\ufffd") and not final:
            end -= 1
            if end == self._read_offset:
                return ""
        new = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = end
        self.text += new
        return new

    def release(self, final: bool) -> str:
        """Text not yet released, minus a tail that may still grow into a stop string."""
        self._catch_up(final)
        end = len(self.text) if final else len(self.text) - self._holdback()
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

    def _holdback(self) -> int:
        return max(self._matched, default=0)

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
