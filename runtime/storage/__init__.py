"""Object storage for batch files and state: a local directory (the default) or S3.

Locations are URIs: `file:///path` (or `file://./relative`) and `s3://bucket/prefix`.
"""

from runtime.storage.base import ObjectStore, StoreError
from runtime.storage.local import LocalStore
from runtime.storage.s3 import S3Store


def open_store(uri: str) -> ObjectStore:
    if uri.startswith("file://"):
        return LocalStore(uri[len("file://") :])
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        return S3Store(bucket, prefix)
    raise ValueError(f"storage_uri: unsupported scheme in {uri!r}; use file:// or s3://")


__all__ = ["LocalStore", "ObjectStore", "S3Store", "StoreError", "open_store"]
