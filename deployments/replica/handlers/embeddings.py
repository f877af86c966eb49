"""/v1/embeddings and /pooling on one replica of a pooling model (engine option `runner: pooling`): each input's
pooled final hidden state (a classifier's label probabilities on /pooling), as floats or base64 (little-endian
float32, as OpenAI sends them)."""

import asyncio
import base64
import math
import struct
import time

from deployments.api.embeddings.protocol import EmbeddingRequest, PoolingRequest
from deployments.api.request_model import engine_priority
from deployments.errors import OpenAIError
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, ValidRequest
from runtime.pooling import label_probabilities


class EmbeddingHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str):
        self.engine = engine
        self.model_id = model_id

    def _prepare(self, req: EmbeddingRequest) -> list[ValidRequest]:
        """Called on a worker thread: every input tokenized and checked before any runs."""
        size = self.engine.embedding_size
        if req.dimensions is not None and req.dimensions > size:
            raise OpenAIError(400, f"dimensions: this model's embeddings have {size}, got {req.dimensions}",
                              "dimensions")
        return validated_inputs(self.engine, req.inputs())

    async def _pooled(self, req: EmbeddingRequest, request_id: str, priority: int, owner: str | None
                      ) -> tuple[list[list[float]], int]:
        """Each input's pooled vector, in order, and the inputs' tokens."""
        valid = await off_loop(self._prepare, req, priority=priority)
        return await pool_all(self.engine, valid, request_id, engine_priority(priority, req.priority), owner)

    async def embed(self, req: EmbeddingRequest, request_id: str, priority: int = 0, owner: str | None = None) -> dict:
        vectors, tokens = await self._pooled(req, request_id, priority, owner)
        data = [{"object": "embedding", "index": i, "embedding": self._encode(v, req)} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": self.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def pool(self, req: PoolingRequest, request_id: str, priority: int = 0, owner: str | None = None) -> dict:
        vectors, tokens = await self._pooled(req, request_id, priority, owner)
        if self.engine.labels is not None and req.use_activation is not False:
            vectors = [label_probabilities(v) for v in vectors]
        data = [{"index": i, "object": "pooling", "data": self._encode(v, req)} for i, v in enumerate(vectors)]
        return list_reply(request_id, self.model_id, data, tokens)

    def _encode(self, vector: list[float], req: EmbeddingRequest) -> list[float] | str:
        if req.dimensions is not None:
            vector = vector[: req.dimensions]
            norm = math.sqrt(sum(x * x for x in vector))
            if self.engine.pooler.normalize and norm > 0:
                vector = [x / norm for x in vector]
        if req.encoding_format == "base64":
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return vector


def validated_inputs(engine: AsyncLLMEngine, inputs: list[str | list[int]]) -> list[ValidRequest]:
    """Texts or token ids as pooling requests, each tokenized and checked (on a worker thread)."""
    return [engine.validate_embedding(engine.encode(p) if isinstance(p, str) else p) for p in inputs]


async def pool_all(engine: AsyncLLMEngine, valid: list[ValidRequest], request_id: str, priority: int,
                   owner: str | None) -> tuple[list[list[float]], int]:
    """What the engine pools for each request, in order (all run at once, as `request_id`-0, -1, ...), and their
    prompts' tokens."""
    deltas = await asyncio.gather(*(engine.embed(v, f"{request_id}-{i}", priority, owner)
                                    for i, v in enumerate(valid)))
    return [d.embedding for d in deltas], sum(len(v.prompt_token_ids) for v in valid)


def list_reply(request_id: str, model_id: str, data: list[dict], tokens: int) -> dict:
    """vLLM's list reply of the pooling routes (/pooling, /score, /classify)."""
    return {"id": request_id, "object": "list", "created": int(time.time()), "model": model_id, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
