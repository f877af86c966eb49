"""The cost of a stop regex per generated token, over a long output: ours (a pattern whose longest match is
bounded is searched only in the tail a new match can span) against searching the whole output after each
token (what an unbounded pattern still needs, and what every pattern cost before), same run, with the
benchmark model's tokenizer. Figures are microseconds per token above detokenizing alone, median of PASSES.

Run: python -m benchmarks.stop_regex
"""

import statistics
import time

from transformers import AutoTokenizer

from benchmarks.common import build_cpu_model, report
from runtime.text.detokenizer import IncrementalDetokenizer

PATTERNS = ["[0-9]{2}", r"\bEND\b", "b[ac]{2,5}d", r"(x|x)*y"]  # the last is unbounded
OUTPUT_TEXT = "abc def ghi " * 4000
PASSES = 3


def seconds(tokenizer, ids: list[int], patterns: list[str], whole: bool) -> float:
    detokenizer = IncrementalDetokenizer(tokenizer, [], [], False, True, patterns)
    if whole:
        detokenizer.stop_regex = [(pattern, compiled, None) for pattern, compiled, _ in detokenizer.stop_regex]
    start = time.perf_counter()
    for token_id in ids:
        assert detokenizer.append(token_id) is None
    return time.perf_counter() - start


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(build_cpu_model())
    ids = tokenizer.encode(OUTPUT_TEXT)
    base = statistics.median(seconds(tokenizer, ids, [], False) for _ in range(PASSES))
    for pattern in PATTERNS:
        per_token = {mode: round((statistics.median(seconds(tokenizer, ids, [pattern], mode == "whole_output")
                                                    for _ in range(PASSES)) - base) / len(ids) * 1e6, 2)
                     for mode in ("ours", "whole_output")}
        report("stop_regex", pattern=pattern, output_tokens=len(ids), output_chars=len(OUTPUT_TEXT),
               us_per_token=per_token)


if __name__ == "__main__":
    main()
