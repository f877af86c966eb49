"""OpenAI file objects kept in the object store: `files/<id>.json` (metadata) beside `files/<id>.jsonl`, and
`file-owners/<owner>/<id>.<bytes>`, an empty object per file that its owner's usage is counted from.

Uploads stream into the store while their size and line count are checked,
so a file over the limits is refused without ever being held in memory. An upload also stays within its key's
quota of files and bytes (batch outputs count toward it, but are always written: a batch's results are never
lost to a quota).
"""

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator

from deployments.api.pagination import cursor_page
from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, ObjectStore
from deployments.storage.usage import OwnerUsage, Quota

# a batch's input (JSONL, its lines checked as it arrives) and output; pictures for Responses' input_image (OpenAI's
# "vision" and "user_data": any bytes, read when a request names them)
PURPOSES = {"batch", "batch_output", "vision", "user_data"}
UPLOAD_PURPOSES = ("batch", "vision", "user_data")  # batch_output files are the server's own, made under its limits


_OWNERS_INDEXED = "file-owners.json"


class FileLimits:
    def __init__(self, max_bytes: int, max_lines: int, per_key: Quota | None = None):
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.per_key = per_key  # an API key's files and their bytes, uploads refused past it


class FileStore:
    def __init__(self, store: ObjectStore, limits: FileLimits):
        self.store = store
        self.limits = limits
        self.usage = OwnerUsage(self._measure)

    @staticmethod
    def content_key(file_id: str) -> str:
        return f"files/{file_id}.jsonl"

    @staticmethod
    def _meta_key(file_id: str) -> str:
        return f"files/{file_id}.json"

    def create(self, filename: str, purpose: str, chunks: Iterable[bytes], file_id: str | None = None,
               owner: str | None = None, within_quota: bool = False) -> dict:
        """Store an upload; raises OpenAIError (400/413) when it breaks a limit or is empty, or (`within_quota`: a
        client's upload) its owner's quota."""
        if purpose not in PURPOSES:
            raise OpenAIError(400, f"purpose: expected one of {', '.join(UPLOAD_PURPOSES)}, got {purpose!r}",
                              "purpose")
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        room = None
        if within_quota and self.limits.per_key is not None:
            room = self.usage.room(owner, self.limits.per_key, "files", "file")
        counted = _Counted(chunks, self.limits if purpose == "batch" else None, room)
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
        self.store.put(self._owner_key(owner, file_id, size), b"")
        self.store.put_json(self._meta_key(file_id), meta)
        self.usage.add(owner, 1, size)
        return public(meta)

    @staticmethod
    def _owner_prefix(owner: str | None) -> str:
        return f"file-owners/{owner or 'anyone'}/"  # an owner is an API key's hex digest

    def _owner_key(self, owner: str | None, file_id: str, size: int) -> str:
        return f"{self._owner_prefix(owner)}{file_id}.{size}"

    def _measure(self, owner: str | None) -> tuple[int, int]:
        """The owner's files and their bytes, from its keys under file-owners/ (indexed once for a store
        written before them)."""
        if self.store.size(_OWNERS_INDEXED) is None:
            for key in self.store.list("files/"):
                if key.endswith(".json"):
                    meta = self.store.get_json(key)
                    self.store.put(self._owner_key(meta.get("_owner"), meta["id"], meta["bytes"]), b"")
            self.store.put_json(_OWNERS_INDEXED, {"version": 1})
        sizes = [int(key.rpartition(".")[2]) for key in self.store.list(self._owner_prefix(owner))]
        return len(sizes), sum(sizes)

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
        size = self.get(file_id, owner)["bytes"]
        self.store.delete(self._meta_key(file_id))
        self.store.delete(self.content_key(file_id))
        self.store.delete(self._owner_key(owner, file_id, size))
        self.usage.add(owner, -1, -size)
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
    """Pass chunks through while enforcing the byte and line limits of a batch input file, and the bytes left
    in its owner's quota (`room`)."""

    def __init__(self, chunks: Iterable[bytes], limits: FileLimits | None, room: int | None = None):
        self.chunks = chunks
        self.limits = limits
        self.room = room

    def __iter__(self) -> Iterator[bytes]:
        size = lines = 0
        last = b"\n"
        for chunk in self.chunks:
            if not chunk:
                continue
            size += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
            if self.room is not None and size > self.room:
                raise OpenAIError(400, f"file: over the {self.room} bytes left in this API key's quota; delete "
                                       "some files first", "file", "quota_exceeded")
            if self.limits:
                if size > self.limits.max_bytes:
                    raise OpenAIError(413, f"file: over the {self.limits.max_bytes}-byte limit", "file")
                if lines > self.limits.max_lines:
                    raise OpenAIError(400, f"file: over the {self.limits.max_lines}-line limit", "file")
            yield chunk
        if self.limits and last != b"\n" and lines + 1 > self.limits.max_lines:
            raise OpenAIError(400, f"file: over the {self.limits.max_lines}-line limit", "file")
