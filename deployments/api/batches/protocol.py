"""The body of POST /v1/batches, and the durations it takes."""

import re

from pydantic import Field, field_validator

from deployments.api.ids import ID
from deployments.api.request_model import RequestModel

COMPLETION_WINDOW = re.compile(r"(\d{1,6})([smhd])")  # at most 999,999 days: expires_at stays within int64
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(completion_window: str) -> int | None:
    """A completion window's seconds (None when it is not one)."""
    match = COMPLETION_WINDOW.fullmatch(completion_window)
    return int(match.group(1)) * _SECONDS[match.group(2)] if match else None


class BatchCreateRequest(RequestModel):
    input_file_id: str = Field(min_length=1)  # a file id, or an s3://bucket/key URI staged by the user
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None

    @field_validator("input_file_id")
    @classmethod
    def _an_id_or_an_s3_uri(cls, v: str) -> str:
        if v.startswith("s3://"):
            if len(v) > 1024 or any(ord(c) < 32 for c in v):
                raise ValueError("an s3:// URI: at most 1024 characters, no control characters")
        elif not ID.fullmatch(v):
            raise ValueError("not a file id (letters, digits, _ and -; at most 200) nor an s3:// URI")
        return v

    @field_validator("completion_window")
    @classmethod
    def _a_duration(cls, v: str) -> str:
        if window_seconds(v) is None:
            raise ValueError(f"expected a duration like '24h' (at most 6 digits, then s, m, h or d), got {v[:64]!r}")
        return v

    @field_validator("metadata")
    @classmethod
    def _openai_metadata_limits(cls, v: dict | None) -> dict | None:
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(s) > 512 for k, s in v.items())):
            raise ValueError("at most 16 pairs, keys of at most 64 characters, values of at most 512 (as OpenAI)")
        return v
