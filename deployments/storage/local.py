"""An object store in a local directory; writes land atomically through a rename."""

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from deployments.storage.base import MissingObjectError, ObjectStore, StoreError


class LocalStore(ObjectStore):
    def __init__(self, root: str):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise StoreError(f"key {key!r} escapes the store")
        return path

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        try:
            f = open(self._path(key), "rb")
        except FileNotFoundError:
            raise MissingObjectError(f"no object {key!r} in {self.uri}") from None
        with f:
            while chunk := f.read(chunk_size):
                yield chunk

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def list(self, prefix: str) -> list[str]:
        return sorted(self._files(prefix))

    def sizes(self, prefix: str) -> dict[str, int]:
        sizes = {}
        for key, path in self._files(prefix).items():
            try:
                sizes[key] = path.stat().st_size
            except FileNotFoundError:  # deleted since listed
                continue
        return sizes

    def _files(self, prefix: str) -> dict[str, Path]:
        base = self._path(prefix) if prefix else self.root
        folder = base if base.is_dir() else base.parent
        if not folder.exists():
            return {}
        keys = ((str(p.relative_to(self.root)), p) for p in folder.rglob("*") if p.is_file())
        return {k: p for k, p in keys if k.startswith(prefix) and not p.name.startswith(".tmp-")}

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
