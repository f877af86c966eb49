"""OpenAI's Conversations API: /v1/conversations and its items."""

from fastapi import APIRouter, Request

from deployments.api.conversations.protocol import ConversationCreate, ConversationUpdate, ItemsCreate
from deployments.api.ids import path_id
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body, query_limit, query_order

router = APIRouter()


@router.post("/v1/conversations", openapi_extra=json_body(ConversationCreate))
async def create_conversation(request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    return await front.conversations.create(await front.body.parse(request, ConversationCreate), owner)


@router.get("/v1/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, request: Request, front: OpenAIFront = Front):
    return await front.conversations.retrieve(path_id("conversation", conversation_id), front.auth.owner(request))


@router.post("/v1/conversations/{conversation_id}", openapi_extra=json_body(ConversationUpdate))
async def update_conversation(conversation_id: str, request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = await front.body.parse(request, ConversationUpdate)
    return await front.conversations.update(path_id("conversation", conversation_id), body, owner)


@router.delete("/v1/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, request: Request, front: OpenAIFront = Front):
    return await front.conversations.delete(path_id("conversation", conversation_id), front.auth.owner(request))


@router.get("/v1/conversations/{conversation_id}/items")
async def list_items(conversation_id: str, request: Request, after: str | None = None, limit: int = 20,
                     order: str = "desc", front: OpenAIFront = Front):
    return await front.conversations.items(path_id("conversation", conversation_id), front.auth.owner(request),
                                           after, query_limit(limit, 100), query_order(order))


@router.post("/v1/conversations/{conversation_id}/items", openapi_extra=json_body(ItemsCreate))
async def add_items(conversation_id: str, request: Request, front: OpenAIFront = Front):
    owner = front.auth.owner(request)
    body = await front.body.parse(request, ItemsCreate)
    return await front.conversations.add_items(path_id("conversation", conversation_id), body, owner)


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
async def get_item(conversation_id: str, item_id: str, request: Request, front: OpenAIFront = Front):
    return await front.conversations.item(path_id("conversation", conversation_id), path_id("item", item_id),
                                          front.auth.owner(request))


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
async def delete_item(conversation_id: str, item_id: str, request: Request, front: OpenAIFront = Front):
    return await front.conversations.delete_item(path_id("conversation", conversation_id), path_id("item", item_id),
                                                 front.auth.owner(request))
