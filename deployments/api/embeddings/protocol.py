"""The request bodies of /v1/embeddings and of vLLM's /pooling (the pooled vector as the model makes it)."""

from typing import Literal

from pydantic import Field, field_validator

from deployments.api.request_model import Priority, RequestModel
from deployments.api.sampling_fields import MAX_SEQUENCES


class PooledInputs(RequestModel):
    """Prompts pooled one vector each: a text, texts, token ids or lists of them."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    user: str | None = None  # accepted, unused
    priority: int = Priority

    @field_validator("input")
    @classmethod
    def _bounded(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(p, (str, list)) and len(p) == 0 for p in v)):
            raise ValueError("input must not be empty")
        if isinstance(v, list) and isinstance(v[0], (str, list)) and len(v) > MAX_SEQUENCES:
            raise ValueError(f"input has {len(v)} items, over the limit of {MAX_SEQUENCES} per request")
        return v

    def inputs(self) -> list[str | list[int]]:
        v = self.input
        return [v] if isinstance(v, str) or isinstance(v[0], int) else list(v)


class EmbeddingRequest(PooledInputs):
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)  # the first `dimensions` components, renormalised


class PoolingRequest(EmbeddingRequest):
    """vLLM's /pooling: an embedding model's embedding, or a classifier's label probabilities (its logits when
    `use_activation` is false)."""

    use_activation: bool | None = None
