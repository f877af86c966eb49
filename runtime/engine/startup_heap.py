"""A serving process's startup heap, kept out of the garbage collector's full passes.

What a server builds before it serves (the model's modules, the tokenizer, torch's, transformers' and Ray's
own objects) lives as long as the process, yet every full collection walks all of it: in an engine process
those passes took a large fraction of a second, every few seconds while a batch ran, and every request waited
them out.
`gc.freeze()` moves it to a generation the collector never scans, so a full pass walks only what serving
allocated since. Only for processes that exist to serve: a script's own objects stay collectable.
"""

import gc


def freeze_startup_heap() -> None:
    gc.collect()  # startup's garbage goes first: frozen, it would stay
    gc.freeze()
