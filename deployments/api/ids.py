"""Object ids: the ones we mint, and the ones a client may name in a path."""

import re
import uuid

from deployments.errors import OpenAIError

ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # a file, batch or response id: never a path, a NUL or 10 kB


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def path_id(kind: str, value: str) -> str:
    """A file, batch or response id from the path; anything that cannot be one is not found (a NUL byte, 10 kB)."""
    if not ID.fullmatch(value):
        raise OpenAIError(404, f"No {kind} with id {value[:64]!r}", f"{kind}_id", f"{kind}_not_found")
    return value
