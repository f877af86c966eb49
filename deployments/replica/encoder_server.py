"""A vision-language model's image encoder as a deployment of its own (`llm_configs[].encoder_config`).

The model's replicas process a prompt's pictures as before (the processor, on their work pool), then send the
pictures' tensors here and get back the rows each picture's placeholder tokens take, through Ray's object store;
their engines take those rows as they come, so no step of theirs waits for a tower. Where the encoder cannot
answer (its replicas lost or failing), a replica's engine encodes the pictures itself, as it does without one.
"""

import asyncio
import logging

import torch

from deployments.app_config import LLMConfig
from runtime import EngineConfig
from runtime.engine.image_encoder import ImageEncoder

logger = logging.getLogger("ray.serve")


class EncoderServer:
    def __init__(self, config: LLMConfig):
        self.encoder = ImageEncoder(EngineConfig(model=config.model_loading_config.source, **config.engine_options))
        self._lock = asyncio.Lock()  # one batch through the tower at a time: they would only share its cores

    async def encode(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        async with self._lock:
            return await asyncio.to_thread(self.encoder.encode, pictures)

    async def stats(self) -> dict:
        return {"images_encoded": self.encoder.images_encoded}


class EncoderClient:
    """A replica's way to its model's encoder deployment, over a Serve handle."""

    def __init__(self, handle):
        self.handle = handle

    async def encode(self, images: tuple, cached_tokens: int = 0) -> tuple:
        """`images` (the prompt's `ImageInput`s) with their encoder outputs in place of their tensors, but for those
        within the prompt's first `cached_tokens`, which the prefix cache holds; as they were where the encoder
        fails (the engine then encodes what it needs)."""
        wanted = [i for i, image in enumerate(images) if image.end > cached_tokens]
        if not wanted:
            return images
        try:
            outputs = await self.handle.encode.remote([images[i].tensors for i in wanted])
        except Exception as e:
            logger.warning("the image encoder failed (%r): this replica's engine encodes the pictures", e)
            return images
        encoded = dict(zip(wanted, outputs, strict=True))
        return tuple(image.replaced_by(encoded[i]) if i in encoded else image for i, image in enumerate(images))
