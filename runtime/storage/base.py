"""The object-store interface the batch manager and Files API are written against."""

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator


class StoreError(IOError):
    """A storage operation failed (missing object, unreachable service)."""


class MissingObjectError(StoreError):
    """The object does not exist (as opposed to a store that cannot be reached)."""


class ObjectStore(ABC):
    uri: str  # where keys live, e.g. "s3://bucket/prefix"

    @abstractmethod
    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write an object from a stream of chunks (large objects in parts); returns its size.

        The object appears whole or not at all.
        """

    @abstractmethod
    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Stream an object's bytes; raises MissingObjectError if it does not exist."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size, or None when it does not exist."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing a missing one is not an error."""

    def uri_of(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, [data])

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def iter_lines(self, key: str) -> Iterator[bytes]:
        """Stream an object line by line (without the newline); each chunk is scanned once, so a line
        spanning many chunks costs its length, not its length squared."""
        head: list[bytes] = []  # pieces of the line that the next newline ends
        for chunk in self.iter_chunks(key):
            *complete, rest = chunk.split(b"\n")
            if complete:
                yield b"".join([*head, complete[0]])
                yield from complete[1:]
                head = []
            head.append(rest)
        last = b"".join(head)
        if last:
            yield last

    def put_json(self, key: str, value) -> None:
        """Atomically replace a small JSON object."""
        self.put(key, json.dumps(value).encode())

    def get_json(self, key: str):
        return json.loads(self.get(key))
