"""What every vision-language family adds to its language model's: the checkpoint's full config kept beside the
language model's (the tower is built from it), pictures' tensors split one dict per picture, and an encoder that
turns each picture into the rows its placeholder tokens take (`encode_images`, run by
`runtime.multimodal.encoder_cache`)."""

import torch
from transformers import PretrainedConfig

from runtime.models.decoder import language_model_config
from runtime.multimodal.processor import split_by_image


class VisionLanguage:
    takes_images = True
    supports_lora = False  # adapters attach to the language model's layers only: not built for the tower
    split_image_tensors = staticmethod(split_by_image)  # the processor's tensors, one dict per picture

    @classmethod
    def text_config(cls, config: PretrainedConfig) -> PretrainedConfig:
        text = language_model_config(config)
        text.vision_language = config  # what the tower is built from
        return text

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        """A picture's placeholder tokens, from its tensors: where the checkpoint's processor cannot be loaded
        (`runtime.multimodal.processor`) and its steps are taken here."""
        raise NotImplementedError

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture's placeholder rows, [tokens, the language model's hidden size]."""
        raise NotImplementedError
