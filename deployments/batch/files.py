"""OpenAI file objects kept in the object store: `files/<id>.json` (metadata) beside `files/<id>.jsonl`.

Uploads stream into the store while their size and line count are checked,
so a file over the limits is refused without ever being held in memory.
"""

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator

from deployments.api.pagination import cursor_page
from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, ObjectStore

PURPOSES = {"batch", "batch_output"}


class FileLimits:
    def __init__(self, max_bytes: int, max_lines: int):
        self.max_bytes = max_bytes
        self.max_lines = max_lines


class FileStore:
    def __init__(self, store: ObjectStore, limits: FileLimits):
        self.store = store
        self.limits = limits

    @staticmethod
    def content_key(file_id: str) -> str:
        return f"files/{file_id}.jsonl"

    @staticmethod
    def _meta_key(file_id: str) -> str:
        return f"files/{file_id}.json"

    def create(self, filename: str, purpose: str, chunks: Iterable[bytes], file_id: str | None = None,
               owner: str | None = None) -> dict:
        """Store an upload; raises OpenAIError (400/413) when it breaks a limit or is empty."""
        if purpose not in PURPOSES:
            raise OpenAIError(400, f"purpose: expected 'batch', got {purpose!r}", "purpose")
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        counted = _Counted(chunks, self.limits if purpose == "batch" else None)
        try:
            size = self.store.put_stream(self.content_key(file_id), counted)
        except OpenAIError:
            self.store.delete(self.content_key(file_id))
            raise
        if size == 0:
            self.store.delete(self.content_key(file_id))
            raise OpenAIError(400, "file: the file is empty", "file")
        meta = {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None, "_owner": owner}
        self.store.put_json(self._meta_key(file_id), meta)
        return public(meta)

    def get(self, file_id: str, owner: str | None = None) -> dict:
        """The file object; another owner's file is as missing as a file that never was."""
        meta = None
        if "/" not in file_id:
            with contextlib.suppress(MissingObjectError):
                meta = self.store.get_json(self._meta_key(file_id))
        if meta is None or meta.get("_owner") != owner:
            raise OpenAIError(404, f"No file with id {file_id!r}", "file_id", "file_not_found")
        return public(meta)

    def content(self, file_id: str, owner: str | None = None) -> Iterator[bytes]:
        self.get(file_id, owner)
        return self.store.iter_chunks(self.content_key(file_id))

    def delete(self, file_id: str, owner: str | None = None) -> dict:
        self.get(file_id, owner)
        self.store.delete(self._meta_key(file_id))
        self.store.delete(self.content_key(file_id))
        return {"id": file_id, "object": "file", "deleted": True}

    def list(self, purpose: str | None, after: str | None, limit: int, order: str, owner: str | None = None) -> dict:
        metas = [self.store.get_json(k) for k in self.store.list("files/") if k.endswith(".json")]
        metas = [public(m) for m in metas if m.get("_owner") == owner and (not purpose or m["purpose"] == purpose)]
        return paginate(metas, after, limit, order)


def public(obj: dict) -> dict:
    """An API object as clients see it: bookkeeping fields (leading underscore) dropped."""
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def paginate(items: list[dict], after: str | None, limit: int, order: str = "desc") -> dict:
    """OpenAI's cursor pagination over objects with `id` and `created_at`."""
    return cursor_page(sorted(items, key=lambda m: (m["created_at"], m["id"]), reverse=order == "desc"), after, limit)


class _Counted:
    """Pass chunks through while enforcing the byte and line limits of a batch input file."""

    def __init__(self, chunks: Iterable[bytes], limits: FileLimits | None):
        self.chunks = chunks
        self.limits = limits

    def __iter__(self) -> Iterator[bytes]:
        size = lines = 0
        last = b"\n"
        for chunk in self.chunks:
            if not chunk:
                continue
            size += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
            if self.limits:
                if size > self.limits.max_bytes:
                    raise OpenAIError(413, f"file: over the {self.limits.max_bytes}-byte limit", "file")
                if lines > self.limits.max_lines:
                    raise OpenAIError(400, f"file: over the {self.limits.max_lines}-line limit", "file")
            yield chunk
        if self.limits and last != b"\n" and lines + 1 > self.limits.max_lines:
            raise OpenAIError(400, f"file: over the {self.limits.max_lines}-line limit", "file")
