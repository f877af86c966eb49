"""Streaming text split at a tag (or a stop string), holding back any tail that could be its start."""


def split_at(buffer: str, tag: str) -> tuple[str, str | None, str]:
    """Split `buffer` at the first `tag`.

    Returns (text before, text after or None when the tag is absent, held back):
    when the tag is absent, a tail of the buffer that is a prefix of the tag is
    held back rather than released, so a tag arriving across chunks is never
    half-emitted.
    """
    before, found, after, held = split_at_first(buffer, (tag,))
    return before, after if found else None, held


def split_at_first(buffer: str, tags: tuple[str, ...]) -> tuple[str, str | None, str, str]:
    """Split `buffer` at the earliest of `tags`: (text before, the tag or None, text after, held back). With no tag
    in it, the longest tail that could start one of them is held back (and nothing is after)."""
    found = min(((buffer.find(tag), tag) for tag in tags if tag in buffer), default=None)
    if found is not None:
        pos, tag = found
        return buffer[:pos], tag, buffer[pos + len(tag) :], ""
    k = max(partial_tag_len(buffer, tag) for tag in tags)
    return buffer[: len(buffer) - k], None, "", buffer[len(buffer) - k :]


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with (0 if none)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
