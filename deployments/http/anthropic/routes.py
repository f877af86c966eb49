"""Anthropic's POST /v1/messages and /v1/messages/count_tokens, whose errors leave in Anthropic's shape."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from deployments.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from deployments.errors import OpenAIError
from deployments.http.anthropic.handler import AnthropicMessages, anthropic_error_of
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, respond
from deployments.http.sse import event_stream

router = APIRouter()
_ANTHROPIC = AnthropicMessages()


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest))
async def create_message(request: Request, front: OpenAIFront = Front):
    """Anthropic's Messages API; its errors in Anthropic's shape, also those of parsing and auth."""
    try:
        body, model, owner = await front.generation(request, MessagesRequest)
        model_id = front.models.reply_name(body.model)
        return await respond(request, body, lambda b: _ANTHROPIC.create(b, model, model_id, owner),
                             lambda b: _ANTHROPIC.stream(b, model, model_id, owner), event_stream)
    except OpenAIError as e:
        return JSONResponse(anthropic_error_of(e), status_code=e.status)


@router.post("/v1/messages/count_tokens", openapi_extra=json_body(CountTokensRequest))
async def count_message_tokens(request: Request, front: OpenAIFront = Front):
    try:
        body, model, _ = await front.generation(request, CountTokensRequest)
        return await _ANTHROPIC.count_tokens(body, model)
    except OpenAIError as e:
        return JSONResponse(anthropic_error_of(e), status_code=e.status)

