"""Streaming text split at a tag, holding back any tail that could be the start of the tag."""


def split_at(buffer: str, tag: str) -> tuple[str, str | None, str]:
    """Split `buffer` at the first `tag`.

    Returns (text before, text after or None when the tag is absent, held back):
    when the tag is absent, a tail of the buffer that is a prefix of the tag is
    held back rather than released, so a tag arriving across chunks is never
    half-emitted.
    """
    pos = buffer.find(tag)
    if pos != -1:
        return buffer[:pos], buffer[pos + len(tag) :], ""
    for k in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:k]):
            return buffer[:-k], None, buffer[-k:]
    return buffer, None, ""
