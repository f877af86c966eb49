"""A serving process's startup heap, kept out of the garbage collector's full passes.

What a server builds before it serves (the model's modules, the tokenizer, torch's, transformers' and Ray's
own objects) lives as long as the process, yet every full collection walks all of it: in an engine process
those passes took a large fraction of a second, every few seconds while a batch ran, and every request waited
them out.
`gc.freeze()` moves it to a generation the collector never scans, so a full pass walks only what serving
allocated since. Only for processes that exist to serve: a script's own objects stay collectable.

A full pass runs when enough objects reached the oldest generation since the last, a quarter of those that
live there; frozen, the startup heap no longer counts, so what serving keeps (its sequences' tokens, say)
would set one off every few dozen engine steps, a cost every step paid on average
(`python -m benchmarks.host_overhead` shows it). So a full pass also waits for FULL_PASS_EVERY passes of the
middle generation, not CPython's 10: reference cycles (few in serving) are freed later, not never.
"""

import gc

FULL_PASS_EVERY = 100


def freeze_startup_heap() -> None:
    gc.collect()  # startup's garbage goes first: frozen, it would stay
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_EVERY)
