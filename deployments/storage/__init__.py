"""Object storage for batch files and state: a local directory (the default) or S3.

Locations are URIs: `file:///path` (or `file://./relative`) and `s3://bucket/prefix`.
"""

from deployments.storage.base import MissingObjectError, ObjectStore, StoreError
from deployments.storage.local import LocalStore
from deployments.storage.s3 import S3Store


def open_store(uri: str) -> ObjectStore:
    if uri.startswith("file://"):
        return LocalStore(uri[len("file://") :])
    if uri.startswith("s3://"):
        return S3Store(*split_s3_uri(uri))
    raise ValueError(f"storage_uri: unsupported scheme in {uri!r}; use file:// or s3://")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` → ("bucket", "some/key")."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def open_s3_object(uri: str) -> tuple[S3Store, str]:
    """The store of an `s3://bucket/key` URI's bucket, and the key in it."""
    bucket, key = split_s3_uri(uri)
    return S3Store(bucket), key


__all__ = ["LocalStore", "MissingObjectError", "ObjectStore", "S3Store", "StoreError", "open_s3_object", "open_store"]
