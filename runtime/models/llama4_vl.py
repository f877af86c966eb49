"""Llama 4 as published (`Llama4ForConditionalGeneration`): its vision tower (`llama4_vision`) over a picture's
tiles, a linear projector, and Llama 4's language model. A picture is spelled out tile by tile: after
<|image_start|>, each tile's <|patch|> tokens, tiles in a row apart by <|tile_x_separator|>, each row ended by
<|tile_y_separator|> (only where there are several tiles), then <|image|> and the global tile's (the only tile's)
<|patch|> tokens, then <|image_end|>; every token but the <|patch|> ones keeps its own embedding (the picture's
`gaps`). Spelling needs each picture's tile grid, which transformers' processor leaves out of its output, so the
image processor and the tokenizer are called apart (`runtime.multimodal.processor`); where the image processor
cannot be loaded (it needs torchvision), `llama4_tiles` takes its steps."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.models.llama4 import Llama4ForCausalLM
from runtime.models.llama4_vision import Llama4VisionModel
from runtime.models.vision_language import VisionLanguage
from runtime.multimodal.llama4_tiles import Llama4Tiles

IMAGE_START, IMAGE_END, GLOBAL_TILE = "<|image_start|>", "<|image_end|>", "<|image|>"
TILE_X_SEPARATOR, TILE_Y_SEPARATOR = "<|tile_x_separator|>", "<|tile_y_separator|>"


class Llama4Projector(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.linear_1 = nn.Linear(config.vision_config.vision_output_dim, config.text_config.hidden_size, bias=False)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear_1(rows)


class Llama4ForConditionalGeneration(VisionLanguage, Llama4ForCausalLM):
    checkpoint_layout = (("language_model.", ""), ("vision_model.", "vision_tower."))
    text_placeholder = GLOBAL_TILE  # what a prompt's text writes where a picture goes
    kept_image_inputs = ("aspect_ratios",)
    image_processor_steps = Llama4Tiles

    def build_tower(self, checkpoint: PretrainedConfig) -> None:
        self.vision_tower = Llama4VisionModel(checkpoint.vision_config)
        self.multi_modal_projector = Llama4Projector(checkpoint)

    @staticmethod
    def split_image_tensors(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        """Each picture's tiles (its grid's, and the global tile beside several) and its grid."""
        pictures, first = [], 0
        for grid in batch["aspect_ratios"][:count]:
            tiles = int(grid.prod()) + (int(grid.prod()) > 1)
            pictures.append({"pixel_values": batch["pixel_values"][first : first + tiles],
                             "aspect_ratios": grid.view(1, 2)})
            first += tiles
        return pictures

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        return tensors["pixel_values"].shape[0] * _tile_tokens(tensors, checkpoint)

    @classmethod
    def picture_tokens_of(cls, tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig, image_token: str
                          ) -> list[str]:
        rows, columns = tensors["aspect_ratios"].view(-1).tolist()
        tile = [image_token] * _tile_tokens(tensors, checkpoint)
        spelled = [IMAGE_START]
        if rows * columns > 1:
            spelled += (((tile + [TILE_X_SEPARATOR]) * columns)[:-1] + [TILE_Y_SEPARATOR]) * rows
        return spelled + [GLOBAL_TILE] + tile + [IMAGE_END]

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Every picture's tiles through the tower in one batch (tiles are all one size), rows split back."""
        rows = self.multi_modal_projector(self.vision_tower(torch.cat([p["pixel_values"] for p in pictures])))
        return [r.flatten(0, 1) for r in rows.split([p["pixel_values"].shape[0] for p in pictures])]

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        name = self.renamed(name)
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            return (name if self.vision_tower is not None else None), ()
        return super().param_for(name)


def _tile_tokens(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
    """A tile's rows: its patches, folded 2 x 2 (a pixel shuffle ratio of 0.5)."""
    vision = checkpoint.vision_config
    height, width = tensors["pixel_values"].shape[-2:]
    return (height // vision.patch_size) * (width // vision.patch_size) // round(1 / vision.pixel_shuffle_ratio**2)
