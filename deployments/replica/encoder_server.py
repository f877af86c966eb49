"""A vision-language model's image encoder as a deployment of its own (`llm_configs[].encoder_config`).

The model's replicas process a prompt's pictures as before (the processor, on their work pool), then send the
pictures' tensors here and get back the rows each picture's placeholder tokens take, through Ray's object store;
their engines take those rows as they come, so no step of theirs waits for a tower. Where the encoder cannot
answer (its replicas lost or failing), a replica's engine encodes the pictures itself, as it does without one.
"""

import asyncio
import logging
from itertools import islice

import torch
from ray import serve

from deployments.app_config import LLMConfig
from runtime import EngineConfig
from runtime.engine.image_encoder import ImageEncoder

logger = logging.getLogger("ray.serve")

# the most pictures one pass through the tower takes (its activations grow with them); calls that come within
# BATCH_WAIT_S of each other share passes
PICTURES_PER_PASS = 16
BATCH_WAIT_S = 0.005


class EncoderServer:
    def __init__(self, config: LLMConfig):
        self.encoder = ImageEncoder(EngineConfig(model=config.model_loading_config.source, **config.engine_options))
        self.passes = 0  # through the tower, over its life

    async def encode(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture's rows; the pictures of calls from every replica that arrive together are encoded together
        (Serve's dynamic batching, one batch at a time: batches would only share the tower's device)."""
        return await self._encode_calls(pictures)

    @serve.batch(max_batch_size=PICTURES_PER_PASS, batch_wait_timeout_s=BATCH_WAIT_S)
    async def _encode_calls(self, calls: list[list[dict[str, torch.Tensor]]]) -> list[list[torch.Tensor]]:
        pictures = [picture for call in calls for picture in call]
        rows = []
        for start in range(0, len(pictures), PICTURES_PER_PASS):
            rows += await asyncio.to_thread(self.encoder.encode, pictures[start : start + PICTURES_PER_PASS])
            self.passes += 1
        each = iter(rows)
        return [list(islice(each, len(call))) for call in calls]

    async def stats(self) -> dict:
        return {"images_encoded": self.encoder.images_encoded, "encoder_passes": self.passes}


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
