"""An object store in an S3 bucket (or any S3-compatible service) through boto3.

Credentials come from boto3's standard chain; the endpoint from `endpoint_url`
or the `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` environment variables, so
MinIO and friends work. Objects over one part are written by multipart upload.
"""

import functools
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from deployments.storage.base import MissingObjectError, ObjectStore, StoreError

PART_SIZE = 8 << 20  # S3's minimum part is 5 MiB
DELETES_PER_REQUEST = 1000  # DeleteObjects' limit


_ENVIRONMENT = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE")


def _client(endpoint_url: str | None):
    """A client shared by the process's stores with the same settings (clients are thread-safe, and building
    one costs far more than reusing it). The environment that configures boto3 is part of the key,
    so a changed one takes effect."""
    return _cached_client(endpoint_url, *(os.environ.get(name) for name in _ENVIRONMENT))


@functools.cache
def _cached_client(endpoint_url: str | None, *_environment: str | None):
    # fail fast on an unreachable store: callers (the batch manager) retry with their own backoff
    config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint_url, config=config)


@contextmanager
def _as_store_error(action: str, uri: str):
    try:
        yield
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            raise MissingObjectError(f"{action} {uri}: no such object") from e
        raise StoreError(f"{action} {uri}: {e}") from e
    except BotoCoreError as e:
        raise StoreError(f"{action} {uri}: {e}") from e


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = _client(endpoint_url)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        buffer, size, upload, parts = bytearray(), 0, None, []
        with _as_store_error("writing", self.uri_of(key)):
            try:
                for chunk in chunks:
                    buffer += chunk
                    size += len(chunk)
                    if len(buffer) >= PART_SIZE:
                        if upload is None:
                            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key))
                        parts.append(self._upload_part(key, upload, len(parts) + 1, bytes(buffer)))
                        buffer.clear()
                if upload is None:
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(buffer))
                    return size
                if buffer:
                    parts.append(self._upload_part(key, upload, len(parts) + 1, bytes(buffer)))
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=self._key(key),
                                                      UploadId=upload["UploadId"], MultipartUpload={"Parts": parts})
                return size
            except BaseException:  # whatever stopped the write (S3, the source, a cancel): no half object
                if upload is not None:
                    self._abort(key, upload)
                raise

    def _upload_part(self, key: str, upload: dict, number: int, data: bytes) -> dict:
        part = self.client.upload_part(Bucket=self.bucket, Key=self._key(key), UploadId=upload["UploadId"],
                                       PartNumber=number, Body=data)
        return {"PartNumber": number, "ETag": part["ETag"]}

    def _abort(self, key: str, upload: dict) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload["UploadId"])
        except (BotoCoreError, ClientError):
            pass  # the bucket's lifecycle rules clean up what we cannot

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        with _as_store_error("reading", self.uri_of(key)):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            yield from body.iter_chunks(chunk_size)

    def size(self, key: str) -> int | None:
        try:
            with _as_store_error("checking", self.uri_of(key)):
                return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
        except MissingObjectError:
            return None

    def list(self, prefix: str) -> list[str]:
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str) -> dict[str, int]:
        sizes = {}
        strip = len(self.prefix) + 1 if self.prefix else 0
        with _as_store_error("listing", self.uri_of(prefix)):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(prefix)):
                sizes |= {obj["Key"][strip:]: obj["Size"] for obj in page.get("Contents", [])}
        return sizes

    def delete(self, key: str) -> None:
        with _as_store_error("deleting", self.uri_of(key)):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), DELETES_PER_REQUEST):
            batch = keys[start:start + DELETES_PER_REQUEST]
            with _as_store_error("deleting", self.uri_of(batch[0])):
                failed = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self._key(key)} for key in batch], "Quiet": True}).get("Errors")
            if failed:
                raise StoreError(f"deleting {self.uri_of(failed[0]['Key'])}: {failed[0].get('Message')}")
