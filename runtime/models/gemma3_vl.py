"""Gemma 3 with its vision tower (`Gemma3ForConditionalGeneration`): SigLIP (`siglip_vision`), a projector that
averages the tower's patch grid down to `mm_tokens_per_image` tokens, norms them (1 + weight) and projects them
to the language model's width, and Gemma 3's language model, in which a picture's tokens attend to each other both
ways (`pictures_attend_both_ways`: a prefill chunk never ends inside a picture, and the attention layers let a
picture's queries see its later keys: `kernels.attention.pictures`). Pan-and-scan crops are refused: transformers'
processor does not make them, so no reference checks them. Checkpoints name their tensors in either of
transformers' layouts (`vision_language.LLAVA_LAYOUT`)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.norms import GemmaRMSNorm
from runtime.models.gemma3 import Gemma3ForCausalLM
from runtime.models.siglip_vision import SiglipVisionTower
from runtime.models.vision_language import VisionLanguage


class Gemma3Projector(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        vision = config.vision_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision.hidden_size, config.text_config.hidden_size), requires_grad=False)
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)
        self.patches_per_side = vision.image_size // vision.patch_size
        self.pool = self.patches_per_side // int(config.mm_tokens_per_image**0.5)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """Patches [N, side * side, vision hidden] -> tokens [N, mm_tokens_per_image, text hidden]."""
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(patches.shape[0], -1, side, side)
        pooled = F.avg_pool2d(grid, self.pool).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).to(patches.dtype)


class Gemma3ForConditionalGeneration(VisionLanguage, Gemma3ForCausalLM):
    pictures_attend_both_ways = True

    def build_tower(self, checkpoint: PretrainedConfig) -> None:
        self.vision_tower = SiglipVisionTower(checkpoint.vision_config)
        self.multi_modal_projector = Gemma3Projector(checkpoint)

    @staticmethod
    def picture_tokens(checkpoint: PretrainedConfig) -> int:
        return checkpoint.mm_tokens_per_image

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        return checkpoint.mm_tokens_per_image

    @staticmethod
    def split_image_tensors(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        if int(batch.get("num_crops", torch.zeros(1)).sum()):
            raise ValueError("pan-and-scan crops (do_pan_and_scan) are not supported")
        return [{"pixel_values": batch["pixel_values"][i : i + 1]} for i in range(count)]

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture's tokens, [mm_tokens_per_image, hidden], in one batch (every picture has the tower's
        size)."""
        return list(self.multi_modal_projector(self.vision_tower(torch.cat([p["pixel_values"] for p in pictures]))))

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        name = self.renamed(name)
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            return (name if self.vision_tower is not None else None), ()
        return super().param_for(name)
