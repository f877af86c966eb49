"""The Files API (uploads of batch input and of pictures, batch output read back) and the Batches API."""

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from deployments.api.batches.protocol import BatchCreateRequest
from deployments.api.ids import path_id
from deployments.batch.files import UPLOAD_PURPOSES
from deployments.errors import OpenAIError
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, query_limit, query_order

router = APIRouter()


@router.post("/v1/files", openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)}}}}}}})
async def upload_file(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)  # a caller without a key learns nothing, not even what the route expects
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise OpenAIError(400, "expected a multipart/form-data upload with fields file and purpose")
    form = await request.form(max_part_size=front.config.max_file_bytes)
    upload, purpose = form.get("file"), form.get("purpose")
    if upload is None or isinstance(upload, str):
        raise OpenAIError(400, "file: a file part is required", "file")
    if purpose not in UPLOAD_PURPOSES:
        raise OpenAIError(400, f"purpose: expected one of {', '.join(UPLOAD_PURPOSES)}, got {purpose!r}", "purpose")
    return await front.batches.upload(upload, purpose, owner)


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, after: str | None = None, limit: int = 10000,
                     order: str = "desc", front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    return await front.batches.list_files(purpose, after, query_limit(limit, 10000), query_order(order), owner)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.get_file(path_id("file", file_id), front.auth.owner(request))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request, front: OpenAIFront = Front):
    content = await front.batches.file_content(path_id("file", file_id), front.auth.owner(request))
    return StreamingResponse(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.delete_file(path_id("file", file_id), front.auth.owner(request))


# --- batches ----------------------------------------------------------------------


@router.post("/v1/batches", openapi_extra=json_body(BatchCreateRequest))
async def create_batch(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = await front.body.parse(request, BatchCreateRequest)
    if body.input_file_id.startswith("s3://") and not front.config.may_read_batch_input(body.input_file_id):
        raise OpenAIError(403, f"input_file_id: this server reads batch inputs only from its storage and the "
                               f"prefixes its operator allows (batch_input_prefixes), not {body.input_file_id[:200]}",
                          "input_file_id", "input_not_allowed")
    return await front.batches.create(body.input_file_id, body.endpoint, body.completion_window, body.metadata,
                                      owner)


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20, front: OpenAIFront = Front):
    return await front.batches.list(after, query_limit(limit, 100), front.auth.owner(request))


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.retrieve(path_id("batch", batch_id), front.auth.owner(request))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, front: OpenAIFront = Front):
    return await front.batches.cancel(path_id("batch", batch_id), front.auth.owner(request))
