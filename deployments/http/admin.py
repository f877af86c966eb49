"""Admin routes for the engine lifecycle (runtime.engine.lifecycle), as reinforcement-learning frameworks drive
vLLM and SGLang between rollouts: pause and resume generation, reset the prefix cache, load new weights from a
checkpoint or from a trainer's process group, sleep and wake up; and vLLM's LoRA adapter loading and unloading.
vLLM's route names and bodies (SGLang's for the weights: `/update_weights_from_disk` with `model_path`,
`/init_weights_update_group` and `/update_weights_from_distributed`); each applies to every replica of the model
the body names (the only one served, by default).

They exist only while the app config sets `admin_api_key`, and take it as `Authorization: Bearer <key>` (an API
key does not open them): without it set they are 404s, as routes that do not exist.
"""

import asyncio
import hmac
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import Field

from deployments.api.request_model import RequestModel
from deployments.errors import OpenAIError
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front
from deployments.replica.adapters import AdapterSource
from runtime.engine.lifecycle import PAUSE_MODES
from runtime.worker.weight_transfer import BACKENDS

router = APIRouter()


class AdminRequest(RequestModel):
    model: str | None = None


class PauseRequest(AdminRequest):
    # keep: requests in flight wait for /resume (new ones queue); abort: they end now, with finish_reason "abort"
    mode: Literal[PAUSE_MODES] = "keep"


class UpdateWeightsRequest(AdminRequest):
    model_path: str = Field(min_length=1)  # a checkpoint directory of the served model's architecture and shapes
    # SGLang's: what the trainer names these weights (replicas given the same name share KV blocks through the
    # shared tier); none: the checkpoint's fingerprint
    weight_version: str | None = Field(None, min_length=1)


class WeightGroupRequest(AdminRequest):
    """SGLang's: the trainer's TCP store, where every replica's ranks join its group (replica k at rank_offset plus
    k times the tensor-parallel size); world_size counts the trainer (rank 0) and every engine rank."""

    master_address: str = Field(min_length=1)
    master_port: int = Field(gt=0, lt=65536)
    rank_offset: int = Field(1, ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"  # SGLang's field, accepted: a model has one group at a time
    backend: Literal[BACKENDS] = "gloo"


class DistributedWeightsRequest(AdminRequest):
    """SGLang's: every checkpoint tensor, in the order the trainer broadcasts them."""

    names: list[str] = Field(min_length=1)
    dtypes: list[str] = Field(min_length=1)
    shapes: list[list[int]] = Field(min_length=1)
    weight_version: str | None = Field(None, min_length=1)  # as UpdateWeightsRequest's; none: the replica's own


class LoadLoraRequest(AdminRequest):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)  # a directory where the route is served, or a file:// or s3:// URI


class UnloadLoraRequest(AdminRequest):
    lora_name: str = Field(min_length=1)


async def _run(request: Request, front: OpenAIFront, body_model: type[AdminRequest], operation: str,
               *fields: str) -> dict:
    """Check the admin key, parse the body (an empty one is the defaults) and run `operation` with the body's
    `fields` on every replica of its model."""
    _check_admin(request, front)
    body = await front.body.parse(request, body_model) if await request.body() else body_model()
    client = front.models.client(body.model)
    states = await client.on_every_replica("lifecycle", operation, *(getattr(body, f) for f in fields))
    return {"success": True, "replicas": len(states)}


def _check_admin(request: Request, front: OpenAIFront) -> None:
    key = front.config.admin_api_key
    if key is None:
        raise OpenAIError(404, f"Not Found: {request.url.path}")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise OpenAIError(401, "this admin route needs the app's admin_api_key as 'Authorization: Bearer <key>'",
                          code="invalid_api_key")


async def _state(request: Request, front: OpenAIFront, model: str | None) -> list[dict]:
    _check_admin(request, front)
    return await front.models.client(model).on_every_replica("lifecycle_state")


def _operation_route(body_model: type[AdminRequest], operation: str, fields: tuple[str, ...]):
    async def route(request: Request, front: OpenAIFront = Front):
        return await _run(request, front, body_model, operation, *fields)

    return route


# route -> (its body, the engine's lifecycle operation, the body's fields the operation takes)
_OPERATIONS = {
    "/pause": (PauseRequest, "pause", ("mode",)),
    "/resume": (AdminRequest, "resume", ()),
    "/reset_prefix_cache": (AdminRequest, "reset_prefix_cache", ()),
    "/update_weights_from_disk": (UpdateWeightsRequest, "update_weights", ("model_path", "weight_version")),
    "/update_weights_from_distributed": (DistributedWeightsRequest, "update_weights_from_distributed",
                                         ("names", "dtypes", "shapes", "weight_version")),
    "/sleep": (AdminRequest, "sleep", ()),
    "/wake_up": (AdminRequest, "wake_up", ()),
}
for path, (body_model, operation, fields) in _OPERATIONS.items():
    router.add_api_route(path, _operation_route(body_model, operation, fields), methods=["POST"], name=operation)


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request, front: OpenAIFront = Front):
    """Returns once every replica's ranks and the trainer have joined: the trainer joins at the same time."""
    _check_admin(request, front)
    body = await front.body.parse(request, WeightGroupRequest)
    states = await front.models.client(body.model).on_every_replica(
        "join_weight_group", body.master_address, body.master_port, body.rank_offset, body.world_size, body.backend)
    return {"success": True, "replicas": len(states)}


@router.get("/is_paused")
async def is_paused(request: Request, model: str | None = None, front: OpenAIFront = Front):
    return {"is_paused": all(state["paused"] for state in await _state(request, front, model))}


@router.get("/is_sleeping")
async def is_sleeping(request: Request, model: str | None = None, front: OpenAIFront = Front):
    return {"is_sleeping": all(state["asleep"] for state in await _state(request, front, model))}


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request, front: OpenAIFront = Front):
    """vLLM's: the adapter is copied under the model's `dynamic_lora_loading_path`, where every replica finds it,
    and each replica's engine reads it (refused, and removed again, if one cannot run it); requests name it
    `<model_id>:<lora_name>`, or `<lora_name>` where no other model or adapter has that name."""
    body, source = await _adapter_route(request, front, LoadLoraRequest)
    await asyncio.to_thread(source.stage, body.lora_name, body.lora_path)
    try:
        await front.models.client(source.model_id).on_every_replica("check_adapter", body.lora_name)
    except OpenAIError:
        await asyncio.to_thread(source.remove, body.lora_name)
        raise
    await front.models.list_adapters()  # requests may name it bare from now on
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request, front: OpenAIFront = Front):
    """vLLM's: the adapter leaves the loading path and every replica; requests running with it finish, later ones
    naming it are 404s."""
    body, source = await _adapter_route(request, front, UnloadLoraRequest)
    await asyncio.to_thread(source.remove, body.lora_name)
    await front.models.list_adapters()
    await front.models.client(source.model_id).on_every_replica("forget_adapter", body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


async def _adapter_route(request: Request, front: OpenAIFront, body_model: type[AdminRequest]):
    _check_admin(request, front)
    body = await front.body.parse(request, body_model)
    source = front.models.adapters[front.models.model_id(body.model)]
    if not isinstance(source, AdapterSource):
        raise OpenAIError(400, f"model: {source.model_id!r} serves no LoRA adapters (it has no lora_config)", "model")
    return body, source
