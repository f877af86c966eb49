"""A batch's stored state: the OpenAI batch object clients get, beside the run's private progress.

The earlier code stored both as one flat dict with underscored progress fields; that format is still read.
"""

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field, model_validator

TERMINAL = {"completed", "failed", "expired", "cancelled"}
Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                 "cancelled"]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class Batch(BaseModel):
    """OpenAI's batch object, exactly as clients get it (field order is the JSON's order)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Status = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    output_file_uri: str | None = None
    error_file_uri: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict | None = None


class Progress(BaseModel):
    """How far the run has got, and whose batch it is: kept in the store, never shown to clients."""

    input_uri: str
    owner: str | None = None
    lines_done: int = 0
    windows_done: int = 0
    expired: bool = False


class BatchState(BaseModel):
    """What `batches/<id>/state.json` holds."""

    batch: Batch
    progress: Progress

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data):
        """Read the earlier format too: one flat dict, the progress fields named with a leading underscore."""
        if isinstance(data, dict) and "_input_uri" in data:
            return {"batch": {k: v for k, v in data.items() if not k.startswith("_")},
                    "progress": {k[1:]: v for k, v in data.items() if k.startswith("_")}}
        return data


def new_batch(input_file_id: str, endpoint: str, window_seconds: int, completion_window: str,
              metadata: dict | None, input_uri: str, owner: str | None) -> BatchState:
    now = int(time.time())
    batch = Batch(id=f"batch_{uuid.uuid4()}", endpoint=endpoint, input_file_id=input_file_id,
                  completion_window=completion_window, created_at=now, expires_at=now + window_seconds,
                  metadata=metadata)
    return BatchState(batch=batch, progress=Progress(input_uri=input_uri, owner=owner))
