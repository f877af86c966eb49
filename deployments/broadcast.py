"""A call made on every replica of a deployment, not on the one Serve would pick: what the engine lifecycle's admin
routes need (a paused, updated or sleeping model is all of its replicas).

Ray Serve has no public broadcast yet; Ray Serve LLM's (`ray.llm`'s, experimental) reaches each running replica
of a handle's deployment. It is wrapped here alone, so a change of it touches one place.

That broadcast reads the handle's request router from its own thread. On a handle no request has gone through
yet, the router's loop may be building that router at the same moment, and the read then builds it off the loop
and fails ("no running event loop"). One routed call first (`healthy`, which every LLMServer answers at once)
leaves the router built by its own loop.
"""

import asyncio

from ray.exceptions import RayTaskError
from ray.llm._internal.serve.utils.broadcast import broadcast
from ray.serve.handle import DeploymentHandle

from deployments.errors import OpenAIError

ROUTER_READY_S = 30


async def on_every_replica(handle: DeploymentHandle, method: str, *args) -> list:
    """`method(*args)` on each running replica of `handle`'s deployment, at once; their results. An error a replica
    raised in OpenAI's shape is raised as it is (the first such)."""
    try:
        await asyncio.wait_for(handle.healthy.remote(), ROUTER_READY_S)
        return await asyncio.to_thread(broadcast, handle, method, args)
    except RayTaskError as e:
        if isinstance(e.cause, OpenAIError):
            raise e.cause from None
        raise OpenAIError(500, f"{method} failed on a replica: {e.cause!r}") from None
    except TimeoutError:
        raise OpenAIError(503, "no replica of the model is running") from None
