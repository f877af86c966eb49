"""Mistral 3 (`Mistral3ForConditionalGeneration`: Mistral Small 3.1 and 3.2, Magistral Small): Pixtral's tower
(`pixtral_vision`) read at `vision_feature_layer`, a projector that norms the patches, merges each 2 x 2 block of
them into one (a learned linear map of the four), and projects them through two layers, and a Mistral language model.
A picture is spelled out row by row: a row's [IMG] tokens then [IMG_BREAK], the last row ending in [IMG_END]; the
breaks and the end keep their own embeddings (the picture's `gaps`). Transformers' Pixtral processor needs
torchvision; where it cannot be loaded the checkpoint's image processor and tokenizer take its steps, spelling
pictures out as its `replace_image_token` does. Checkpoints name their tensors in either of transformers' layouts
(`vision_language.LLAVA_LAYOUT`)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.layers.norms import RMSNorm
from runtime.models.llava import LlavaProjector
from runtime.models.mistral import MistralForCausalLM
from runtime.models.pixtral_vision import PixtralVisionTower
from runtime.models.vision_language import VisionLanguage, feature_layers

# transformers' PixtralProcessor's defaults, which Mistral's checkpoints keep
IMAGE_BREAK, IMAGE_END = "[IMG_BREAK]", "[IMG_END]"


class Mistral3Projector(LlavaProjector):
    def __init__(self, config: PretrainedConfig, num_feature_layers: int):
        super().__init__(config, num_feature_layers)
        width = config.vision_config.hidden_size * num_feature_layers
        self.norm = RMSNorm(width, config.text_config.rms_norm_eps)
        self.merge = config.spatial_merge_size
        self.patch_merger = nn.Module()
        self.patch_merger.merging_layer = nn.Linear(width * self.merge**2, width, bias=False)

    def forward(self, features: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        """A picture's patch features [rows x columns, width] -> its tokens [merged rows x columns, text hidden]."""
        grid = self.norm(features).T.reshape(1, -1, rows, columns)
        blocks = F.unfold(grid, kernel_size=self.merge, stride=self.merge)[0].T  # each 2 x 2 block, raster order
        return super().forward(self.patch_merger.merging_layer(blocks))


class Mistral3ForConditionalGeneration(VisionLanguage, MistralForCausalLM):
    def build_tower(self, checkpoint: PretrainedConfig) -> None:
        self.feature_layers = feature_layers(checkpoint)
        self.patch_size = checkpoint.vision_config.patch_size
        self.vision_tower = PixtralVisionTower(checkpoint.vision_config, max(self.feature_layers))
        self.multi_modal_projector = Mistral3Projector(checkpoint, len(self.feature_layers))

    @classmethod
    def check_config(cls, config: PretrainedConfig, max_model_len: int) -> None:
        super().check_config(config, max_model_len)
        if config.model_type != "mistral":
            raise InvalidInputError("model", f"Mistral3ForConditionalGeneration with a {config.model_type} language "
                                    "model is not supported; supported: mistral")

    @staticmethod
    def split_image_tensors(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        """Each picture's pixels at its own size (the processor pads a batch's to the largest), and that size."""
        return [{"pixel_values": batch["pixel_values"][i : i + 1, :, :height, :width].contiguous(),
                 "image_sizes": batch["image_sizes"][i : i + 1]}
                for i, (height, width) in enumerate(batch["image_sizes"].tolist()[:count])]

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        rows, columns = _token_grid(tensors, checkpoint)
        return rows * columns

    @classmethod
    def picture_tokens_of(cls, tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig, image_token: str
                          ) -> list[str]:
        rows, columns = _token_grid(tensors, checkpoint)
        return (([image_token] * columns + [IMAGE_BREAK]) * rows)[:-1] + [IMAGE_END]

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture through the tower on its own (pictures differ in size, and attend within themselves)."""
        outputs = []
        for picture in pictures:
            states = self.vision_tower(picture["pixel_values"])
            height, width = picture["pixel_values"].shape[-2:]
            features = torch.cat([states[i] for i in self.feature_layers], dim=-1)
            outputs.append(self.multi_modal_projector(features, height // self.patch_size, width // self.patch_size))
        return outputs

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        name = self.renamed(name)
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            if self.vision_tower is None:
                return None, ()
            if name.startswith("vision_tower.transformer.layers."):
                if int(name.split(".")[3]) >= len(self.vision_tower.transformer.layers):
                    return None, ()  # past the deepest layer read
            return name, ()
        return super().param_for(name)


def _token_grid(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> tuple[int, int]:
    """A picture's merged-patch rows and columns, from its size."""
    height, width = tensors["image_sizes"].view(-1).tolist()
    unit = checkpoint.vision_config.patch_size * checkpoint.spatial_merge_size
    return height // unit, width // unit
