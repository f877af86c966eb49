"""The base of every request body the APIs parse."""

from pydantic import BaseModel, ConfigDict


class RequestModel(BaseModel):
    """A part of a client's request. Unknown fields are ignored, as vLLM and SGLang ignore them (clients send
    other servers' extensions and echo whole response messages back); the route reports the top-level ones in
    the `x-ignored-fields` response header. Known fields are strict: a wrong type or range is a 400. NaN and
    infinities are refused."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
