"""Qwen2-VL and Qwen2.5-VL (`Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration`): their vision
towers (`qwen2_vl_vision`, `qwen2_5_vl_vision`) and Qwen2's language model rotating by M-RoPE (time, row and
column sections of each head: `runtime.multimodal.mrope`). What Qwen's
vision-language families share (`QwenVisionLanguage`: Qwen3.5's too) is how a picture's tensors are laid out, how
many tokens it takes and where they sit in M-RoPE's positions.

Checkpoints name the tower `visual.` and the language model `model.` (as Qwen publishes them), or, as
transformers 5 saves them, `model.visual.` and `model.language_model.`."""

import torch
from transformers import PretrainedConfig

from runtime.layers.attention import head_dim_of
from runtime.layers.rotary import MultimodalRotaryTables
from runtime.models.qwen2 import Qwen2ForCausalLM
from runtime.models.qwen2_5_vl_vision import Qwen2_5VisionTower
from runtime.models.qwen2_vl_vision import Qwen2VisionTower
from runtime.models.vision_language import VisionLanguage
from runtime.multimodal.inputs import ImageInput
from runtime.multimodal.mrope import MRopeLayout


class QwenVisionLanguage(VisionLanguage):
    multimodal_rope = True
    checkpoint_layout = (("model.visual.", "visual."), ("model.language_model.", "model."))
    tower: type  # the family's vision tower
    interleaved_rope = False  # M-RoPE's frequencies by sections, or interleaved (`MultimodalRotaryTables`)
    mrope_section = [16, 24, 24]  # where the config names none (transformers' default for the family)

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        self.visual = None  # served text-only
        if config.vision_language is not None:
            vision = config.vision_language.vision_config
            self.visual = self.tower(vision)
            self.merge = vision.spatial_merge_size
        self.model.rotary["default"] = MultimodalRotaryTables(config, head_dim_of(config), max_positions,
                                                              self.interleaved_rope, self.mrope_section)

    @staticmethod
    def split_image_tensors(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        """Each picture's patches (the processor concatenates them) and its grid."""
        grids = batch["image_grid_thw"]
        patches = batch["pixel_values"].split(grids.prod(-1).tolist())
        return [{"pixel_values": p, "image_grid_thw": grids[i : i + 1]} for i, p in enumerate(patches)]

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        return int(tensors["image_grid_thw"].prod()) // checkpoint.vision_config.spatial_merge_size**2

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture through the tower on its own (pictures differ in size, and attend within themselves)."""
        return [self.visual(p["pixel_values"], tuple(p["image_grid_thw"].view(-1).tolist())) for p in pictures]

    def rope_layout(self, images: tuple[ImageInput, ...]) -> MRopeLayout:
        return MRopeLayout.of(images, self.merge)

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        name = self.renamed(name)
        if name.startswith("visual."):
            return name if self.visual is not None else None, ()
        return super().param_for(name)


class Qwen2_5_VLForConditionalGeneration(QwenVisionLanguage, Qwen2ForCausalLM):
    tower = Qwen2_5VisionTower


class Qwen2VLForConditionalGeneration(QwenVisionLanguage, Qwen2ForCausalLM):
    tower = Qwen2VisionTower
