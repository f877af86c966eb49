"""SGLang's native POST /generate."""

from fastapi import APIRouter, Request

from deployments.api.generate.protocol import GenerateRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, respond

router = APIRouter()


@router.post("/generate", openapi_extra=json_body(GenerateRequest))
async def generate(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, GenerateRequest)
    return await respond(request, body, lambda b: model.generate(b, owner), lambda b: model.generate_stream(b, owner))
