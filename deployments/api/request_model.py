"""The base of every request body the APIs parse."""

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

# vLLM's `priority` on a request: lower runs first, 0 by default; the engine orders by it within a tier (online
# requests, then batch lines: `engine_priority`)
Priority = Field(0, ge=-(2**31), lt=2**31)


class RequestModel(BaseModel):
    """A part of a client's request. Unknown fields are ignored, as vLLM and SGLang ignore them (clients send
    other servers' extensions and echo whole response messages back); the route reports the top-level ones in
    the `x-ignored-fields` response header. Known fields are strict: a wrong type or range is a 400. NaN and
    infinities are refused."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    _trace: dict | None = PrivateAttr(None)  # the trace context it carries to its replica (deployments/tracing.py)


def engine_priority(tier: int, priority: int) -> int:
    """What the engine orders a request by (lower first): its caller's tier (0 online, a batch line's above
    every online request's) plus the request's own `priority`."""
    return tier + priority
