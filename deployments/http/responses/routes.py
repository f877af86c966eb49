"""POST /v1/responses, and a stored response read back (GET), listed (input_items), cancelled (a background one)
and deleted."""

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from deployments.api.ids import path_id
from deployments.api.responses.protocol import ResponsesRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, query_limit, query_order, respond
from deployments.http.sse import event_stream

router = APIRouter()


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest))
async def create_response(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = front.salted(await front.body.parse(request, ResponsesRequest), owner)
    request.state.ignored_fields = [*request.state.ignored_fields, *body.ignored_tools()]
    model, responses = front.models.client(body.model), front.responses
    model_id = front.models.reply_name(body.model)
    return await respond(request, body, lambda b: responses.create(b, model, model_id, owner),
                         lambda b: responses.stream(b, model, model_id, owner), event_stream)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, stream: bool = False, starting_after: int | None = None,
                       front: OpenAIFront = Front):
    """The stored response; with `stream`, a background stream's events again (after `starting_after`)."""
    response_id, owner = path_id("response", response_id), front.auth.owner(request)
    if not stream:
        return await front.responses.retrieve(response_id, owner)
    events = await front.responses.follow(response_id, owner, starting_after)
    return StreamingResponse(event_stream(events), media_type="text/event-stream")


@router.get("/v1/responses/{response_id}/input_items")
async def response_input_items(response_id: str, request: Request, after: str | None = None, limit: int = 20,
                               order: str = "desc", front: OpenAIFront = Front):
    return await front.responses.input_items(path_id("response", response_id), front.auth.owner(request), after,
                                             query_limit(limit, 100), query_order(order))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, front: OpenAIFront = Front):
    return await front.responses.cancel(path_id("response", response_id), front.auth.owner(request))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, front: OpenAIFront = Front):
    return await front.responses.delete(path_id("response", response_id), front.auth.owner(request))
