"""/v1/embeddings on one replica of an embedding model (engine option `runner: pooling`): each input's pooled
final hidden state, as floats or base64 (little-endian float32, as OpenAI sends them)."""

import asyncio
import base64
import math
import struct

from deployments.api.embeddings.protocol import EmbeddingRequest
from deployments.api.request_model import engine_priority
from deployments.errors import OpenAIError
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, ValidRequest


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
        return [self.engine.validate_embedding(self.engine.encode(p) if isinstance(p, str) else p)
                for p in req.inputs()]

    async def embed(self, req: EmbeddingRequest, request_id: str, priority: int = 0, owner: str | None = None) -> dict:
        valid = await off_loop(self._prepare, req, priority=priority)
        priority = engine_priority(priority, req.priority)
        deltas = await asyncio.gather(*(self.engine.embed(v, f"{request_id}-{i}", priority, owner)
                                        for i, v in enumerate(valid)))
        tokens = sum(len(v.prompt_token_ids) for v in valid)
        data = [{"object": "embedding", "index": i, "embedding": self._encode(d.embedding, req)}
                for i, d in enumerate(deltas)]
        return {"object": "list", "data": data, "model": self.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def _encode(self, vector: list[float], req: EmbeddingRequest) -> list[float] | str:
        if req.dimensions is not None:
            vector = vector[: req.dimensions]
            norm = math.sqrt(sum(x * x for x in vector))
            if self.engine.pooler.normalize and norm > 0:
                vector = [x / norm for x in vector]
        if req.encoding_format == "base64":
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return vector
