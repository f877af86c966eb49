"""A vision-language model's image encoder on its own: the tower and projector, with no language model beside
them. What an encoder deployment runs (`deployments/replica/encoder_server.py`): the model's replicas send it
each prompt's processed pictures, and their engines take the rows it returns as the pictures' inputs
(`ImageInput.encoded`) instead of running their own tower in a step."""

import torch

from runtime.config import EngineConfig
from runtime.errors import require
from runtime.models.spec import ModelSpec
from runtime.worker.model_builder import build_model


class ImageEncoder:
    def __init__(self, config: EngineConfig):
        self.spec = ModelSpec.resolve(config)
        require(self.spec.takes_images, "model", f"{config.model} takes no images: there is no encoder to serve"
                f"{' (limit_mm_per_prompt image 0 serves it text-only)' if self.spec.model_class.takes_images else ''}")
        self.device = torch.device(config.device)
        self.model, _ = build_model(self.spec, config, self.device, self.spec.path, encoder_only=True)
        self.images_encoded = 0

    def encode(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture's rows, [placeholder tokens, the language model's hidden size], on the CPU: the encoder's
        outputs for the pictures' tensors (as `RequestValidator.process_images` made them), in one batch."""
        with torch.inference_mode():
            outputs = self.model.encode_images([{name: t.to(self.device) for name, t in picture.items()}
                                                for picture in pictures])
        self.images_encoded += len(pictures)
        return [output.cpu() for output in outputs]
