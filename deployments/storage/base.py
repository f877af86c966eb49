"""The object-store interface the batch manager and Files API are written against."""

import json
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

READ_AHEAD = 8  # objects fetched at once by iter_concatenated (within boto3's 10 pooled connections)


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
    def sizes(self, prefix: str) -> dict[str, int]:
        """Each key under `prefix` with its size (one listing, no object read)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing a missing one is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        """Remove the objects (missing ones are not an error); S3 takes a thousand a request."""
        for key in keys:
            self.delete(key)

    def uri_of(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, [data])

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def iter_concatenated(self, keys: Iterable[str]) -> Iterator[bytes]:
        """The objects' bytes one after the other. The first chunk of each of the next READ_AHEAD objects is
        fetched on threads while the one before is read, so their round trips overlap (fetching a small object
        from S3 is mostly its round trip); memory holds at most READ_AHEAD first chunks more than a plain read."""
        with ThreadPoolExecutor(READ_AHEAD) as pool:
            started: deque[tuple[Iterator[bytes], Future]] = deque()
            for key in keys:
                stream = self.iter_chunks(key)
                started.append((stream, pool.submit(next, stream, None)))
                if len(started) == READ_AHEAD:
                    yield from _rest(*started.popleft())
            while started:
                yield from _rest(*started.popleft())

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

    def get_json_many(self, keys: Iterable[str]) -> list:
        """Small JSON objects, in `keys`' order; READ_AHEAD are fetched at once, so their round trips overlap."""
        with ThreadPoolExecutor(READ_AHEAD) as pool:
            return list(pool.map(self.get_json, keys))


def _rest(stream: Iterator[bytes], first: Future) -> Iterator[bytes]:
    """A stream whose first chunk `first` fetched (None: it was empty)."""
    if (chunk := first.result()) is not None:
        yield chunk
        yield from stream
