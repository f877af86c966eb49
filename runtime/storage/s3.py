"""An object store in an S3 bucket (or any S3-compatible service) through boto3.

Credentials come from boto3's standard chain; the endpoint from `endpoint_url`
or the `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` environment variables, so
MinIO and friends work. Objects over one part are written by multipart upload.
"""

from collections.abc import Iterable, Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from runtime.storage.base import ObjectStore, StoreError

PART_SIZE = 8 << 20  # S3's minimum part is 5 MiB


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        # fail fast on an unreachable store: callers (the batch manager) retry with their own backoff
        config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
        self.client = boto3.client("s3", endpoint_url=endpoint_url, config=config)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        buffer, size, upload, parts = bytearray(), 0, None, []
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
        except (BotoCoreError, ClientError) as e:
            if upload is not None:
                self._abort(key, upload)
            raise StoreError(f"writing {self.uri_of(key)}: {e}") from e
        except BaseException:
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
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            yield from body.iter_chunks(chunk_size)
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"reading {self.uri_of(key)}: {e}") from e

    def size(self, key: str) -> int | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StoreError(f"checking {self.uri_of(key)}: {e}") from e
        except BotoCoreError as e:
            raise StoreError(f"checking {self.uri_of(key)}: {e}") from e

    def list(self, prefix: str) -> list[str]:
        keys = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(prefix)):
                keys += [obj["Key"][strip:] for obj in page.get("Contents", [])]
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"listing {self.uri_of(prefix)}: {e}") from e
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"deleting {self.uri_of(key)}: {e}") from e
