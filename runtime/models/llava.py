"""LLaVA (`LlavaForConditionalGeneration`, the shape LLaVA-1.5 and many fine-tunes keep): a CLIP vision tower, a
two-layer projector, and a language model of a family already served (Llama, Mistral, Qwen2, Qwen3). A picture's
placeholder tokens take the projected hidden states of one (or several, concatenated) of the tower's layers, its
class token dropped under the `default` feature strategy.

Checkpoints name their tensors in either of transformers' layouts (`vision_language.LLAVA_LAYOUT`)."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import activation
from runtime.models.clip_vision import CLIPVisionTower
from runtime.models.decoder import CausalLM
from runtime.models.llama import LlamaForCausalLM
from runtime.models.mistral import MistralForCausalLM
from runtime.models.qwen2 import Qwen2ForCausalLM
from runtime.models.qwen3 import Qwen3ForCausalLM
from runtime.models.vision_language import VisionLanguage, feature_layers


class LlavaProjector(nn.Module):
    def __init__(self, config: PretrainedConfig, num_feature_layers: int):
        super().__init__()
        bias = getattr(config, "multimodal_projector_bias", True)
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        self.linear_1 = nn.Linear(vision * num_feature_layers, text, bias=bias)
        self.act = activation(config.projector_hidden_act)
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


class LlavaMixin(VisionLanguage):
    """What LLaVA adds to its language model's family (`llava_of`)."""

    def build_tower(self, checkpoint: PretrainedConfig) -> None:
        self.feature_layers = feature_layers(checkpoint)
        self.drop_class_token = checkpoint.vision_feature_select_strategy == "default"
        self.vision_tower = CLIPVisionTower(checkpoint.vision_config, max(self.feature_layers))
        self.multi_modal_projector = LlavaProjector(checkpoint, len(self.feature_layers))

    @staticmethod
    def image_token_counts(tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig) -> int:
        patch = checkpoint.vision_config.patch_size
        height, width = tensors["pixel_values"].shape[-2:]
        return (height // patch) * (width // patch) + (checkpoint.vision_feature_select_strategy != "default")

    def encode_images(self, pictures: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each picture's placeholder rows, [tokens, hidden], computed in one batch (LLaVA's pictures share a
        size)."""
        states = self.vision_tower(torch.cat([p["pixel_values"] for p in pictures]))
        start = 1 if self.drop_class_token else 0
        features = torch.cat([states[i][:, start:] for i in self.feature_layers], dim=-1)
        return list(self.multi_modal_projector(features))

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        name = self.renamed(name)
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            return self._tower_param(name), ()
        return super().param_for(name)

    def _tower_param(self, name: str) -> str | None:
        """The tower's (or projector's) parameter, or None for a tensor of what is not built: the post-norm, the
        layers past the deepest one read, everything when the model is served text-only."""
        if self.vision_tower is None or name.startswith("vision_tower.post_layernorm."):
            return None
        if name.startswith("vision_tower.encoder.layers."):
            if int(name.split(".")[3]) >= len(self.vision_tower.encoder.layers):
                return None
        return name


def llava_of(family: type[CausalLM], name: str) -> type[CausalLM]:
    """LLaVA over `family`'s language model; `name` is the module attribute it is bound to (pickling finds it so)."""
    return type(name, (LlavaMixin, family), {"__module__": __name__})


LlavaLlama = llava_of(LlamaForCausalLM, "LlavaLlama")
LlavaMistral = llava_of(MistralForCausalLM, "LlavaMistral")
LlavaQwen2 = llava_of(Qwen2ForCausalLM, "LlavaQwen2")
LlavaQwen3 = llava_of(Qwen3ForCausalLM, "LlavaQwen3")
# by the language model's `model_type`
LLAVA_FAMILIES = {"llama": LlavaLlama, "mistral": LlavaMistral, "qwen2": LlavaQwen2, "qwen3": LlavaQwen3}
