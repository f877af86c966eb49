"""vLLM's POST /tokenize and POST /detokenize."""

from fastapi import APIRouter, Request

from deployments.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body

router = APIRouter()


@router.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
async def tokenize(request: Request, front: OpenAIFront = Front):
    body, model, _ = await front.generation(request, TokenizeRequest)
    return await model.tokenize(body)


@router.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
async def detokenize(request: Request, front: OpenAIFront = Front):
    body, model, _ = await front.generation(request, DetokenizeRequest)
    return await model.detokenize(body)
