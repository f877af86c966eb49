"""POST /v1/chat/completions."""

from fastapi import APIRouter, Request

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, respond

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def chat_completions(request: Request, front: OpenAIFront = Front):
    body, model, owner = await front.generation(request, ChatCompletionRequest)
    return await respond(request, body, lambda b: model.chat(b, owner=owner), lambda b: model.chat_stream(b, owner))
