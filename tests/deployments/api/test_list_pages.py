"""List pages (batches, files, a response's input items) are bounded in bytes, not only in count.

The worst batch object: 16 metadata pairs of 64 + 512 control characters (6 bytes each as JSON), an s3:// input
URI of 1,019 four-byte characters, a failed batch's message at its cap: about 67 kB, so 100 of them (the largest
`limit`) would be 6.5 MB. A page holds the objects that fit in PAGE_BYTES (always the first) and says has_more,
so a client following `after` still gets every object once.
"""

import json

from deployments.api.pagination import PAGE_BYTES, cursor_page
from deployments.batch.files import paginate
from deployments.batch.job import _ERROR_CHARS
from deployments.batch.state import BatchError, BatchErrors, new_batch


def _worst_batch(i: int) -> dict:
    metadata = {f"{k:02d}".rjust(64, "\x00"): "\x00" * 512 for k in range(16)}
    state = new_batch("s3://" + "\U0001f600" * 1019, "/v1/chat/completions", 86400 * 999_999, "999999d",
                      metadata, "s3://x", "a" * 32)
    state.batch.errors = BatchErrors(data=[BatchError(code="internal_error", message="\x00" * _ERROR_CHARS)])
    state.batch.output_file_uri = state.batch.error_file_uri = "s3://" + "b" * 1000 + "/files/x.jsonl"
    state.batch.created_at = i
    return state.batch.model_dump()


def _size(page: dict) -> int:
    """The page's bytes as the routes send it (Starlette's JSONResponse)."""
    return len(json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode())


def _every_page(items: list[dict], limit: int, page=cursor_page) -> list[dict]:
    pages, after = [], None
    while not pages or pages[-1]["has_more"]:
        pages.append(page(items, after, limit))
        after = pages[-1]["last_id"]
    return pages


def test_a_page_of_the_largest_batch_objects_stays_within_the_bound_and_paging_loses_none():
    batches = [_worst_batch(i) for i in range(100)]
    assert 60_000 < _size(batches[0]) < 70_000 and _size({"data": batches}) > 6 * PAGE_BYTES
    pages = _every_page(batches, 100)
    assert all(_size(page) <= PAGE_BYTES for page in pages) and len(pages) == 7
    assert [b for page in pages for b in page["data"]] == batches


def test_a_page_of_files_at_the_largest_limit_stays_within_the_bound():
    files = [{"id": f"file-{i:032x}", "object": "file", "bytes": 2**40, "created_at": i, "filename": "\x00" * 200,
              "purpose": "batch_output", "status": "processed", "expires_at": None, "status_details": None}
             for i in range(10_000)]
    pages = _every_page(files, 10_000, lambda items, after, limit: paginate(items, after, limit))
    assert all(_size(page) <= PAGE_BYTES for page in pages) and len(pages) == 14
    assert [f for page in pages for f in page["data"]] == files[::-1]


def test_an_object_over_the_bound_comes_alone():
    items = [{"id": "item-0", "content": "x" * PAGE_BYTES}, {"id": "item-1", "content": "y"}]
    pages = _every_page(items, 100)
    assert [[i["id"] for i in page["data"]] for page in pages] == [["item-0"], ["item-1"]]
    assert [page["has_more"] for page in pages] == [True, False]
