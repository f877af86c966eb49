"""POST /v1/embeddings."""

from fastapi import APIRouter, Request

from deployments.api.embeddings.protocol import EmbeddingRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body

router = APIRouter()


@router.post("/v1/embeddings", openapi_extra=json_body(EmbeddingRequest))
async def embeddings(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, EmbeddingRequest)
    return await model.embeddings(body, owner=owner)
