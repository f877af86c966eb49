"""Client JSON (request bodies, batch input lines) parsed strictly and with bounded work.

Strict where Python's `json` is lenient: bytes are UTF-8 (never sniffed as UTF-16
or UTF-32), NaN and Infinity are not numbers, strings are valid Unicode (no
lone surrogates, which tokenizers cannot encode). Bounded: nesting at most
MAX_DEPTH levels (so nothing downstream recurses deeply), integers of at most
Python's 4,300 digits. Every refusal is a ValueError with a message for the client.
"""

import json

MAX_DEPTH = 64


def loads_object(raw: bytes) -> dict:
    """`raw` as a JSON object; raises ValueError saying what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # bad UTF-8, bad JSON, an over-long integer, NaN / Infinity
        raise ValueError(f"not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    _check(data)
    return data


def _check(data: dict) -> None:
    """Walk the document breadth-first (no recursion): its depth, and every key and string's Unicode."""
    level = [data]
    for _ in range(MAX_DEPTH):
        children = []
        for node in level:
            items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            for item in items:
                if isinstance(item, (dict, list)):
                    children.append(item)
                elif isinstance(item, str) and not item.isascii():
                    try:
                        item.encode("utf-8")
                    except UnicodeEncodeError:
                        raise ValueError("a string holds a lone UTF-16 surrogate") from None
        if not children:
            return
        level = children
    raise ValueError(f"nested more than {MAX_DEPTH} levels deep")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
