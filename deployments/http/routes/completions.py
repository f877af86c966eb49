"""POST /v1/completions."""

from fastapi import APIRouter, Request

from deployments.api.completions.protocol import CompletionRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, respond

router = APIRouter()


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
async def completions(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, CompletionRequest)
    return await respond(request, body, lambda b: model.completions(b, owner=owner),
                         lambda b: model.completions_stream(b, owner))
