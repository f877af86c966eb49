"""OpenAI's list pages: a window of objects after a cursor, bounded in count and in bytes."""

import json

from deployments.errors import OpenAIError

PAGE_BYTES = 1 << 20  # a list page's JSON, at most: the objects that fit (always the first), has_more after them
_ENVELOPE_BYTES = 1024  # the page's own fields: object, first_id, last_id, has_more


def cursor_page(items: list[dict], after: str | None, limit: int) -> dict:
    """OpenAI's cursor pagination over objects with an `id`, in the order given: `limit` after the one `after`
    names, as many as fit in PAGE_BYTES."""
    return list_page(*cursor_window(items, after, limit))


def cursor_window(items: list, after: str | None, limit: int, id_of=lambda m: m["id"]) -> tuple[list, bool]:
    """The items after the one whose id is `after` (a 400 when none is), at most `limit`, and whether more follow."""
    if after is not None:
        ids = [id_of(m) for m in items]
        if after not in ids:
            raise OpenAIError(400, f"after: no object with id {after[:64]!r}", "after")
        items = items[ids.index(after) + 1:]
    return items[:limit], len(items) > limit


def list_page(window: list[dict], more: bool) -> dict:
    """The list object of a window of objects: those that fit in PAGE_BYTES as JSON (at least one); has_more when
    some were left out or `more` follow."""
    page, size = [], _ENVELOPE_BYTES
    for item in window:
        size += len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) + 1
        if page and size > PAGE_BYTES:
            more = True
            break
        page.append(item)
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": more}
