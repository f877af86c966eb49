"""What every vision-language family adds to its language model's: the checkpoint's full config kept beside the
language model's (the tower is built from it), pictures' tensors split one dict per picture, and an encoder that
turns each picture into the rows its placeholder tokens take (`encode_images`, run by
`runtime.worker.encoder_cache`). Served text-only (`limit_mm_per_prompt` image 0: `runtime.models.spec`),
the config's `vision_language` is None and no tower is built or loaded."""

import copy
from collections.abc import Callable

import torch
from transformers import PretrainedConfig

from runtime.models.decoder import language_model_config
from runtime.multimodal.processor import split_by_image

# transformers' names for a vision-language checkpoint's parts, older (`language_model.model.…`, what LLaVA's and
# Gemma 3's publishers ship and transformers still saves) and newer (`model.language_model.…`), mapped to ours:
# the language model's as a causal LM's, the tower as `vision_tower.`, the projector as `multi_modal_projector.`
LLAVA_LAYOUT = (  # checkpoint prefix -> ours, the first that matches
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
)


def feature_layers(checkpoint: PretrainedConfig) -> list[int]:
    """The tower's layers whose hidden states the projector reads (`vision_feature_layer`: one or several, counted
    from the end where negative; 0 is the embeddings)."""
    layers = checkpoint.vision_feature_layer
    depth = checkpoint.vision_config.num_hidden_layers
    return [i if i >= 0 else depth + 1 + i for i in ([layers] if isinstance(layers, int) else layers)]


class VisionLanguage:
    takes_images = True
    checkpoint_layout: tuple[tuple[str, str], ...] = LLAVA_LAYOUT  # checkpoint prefix -> ours, the first that matches
    supports_lora = False  # adapters attach to the language model's layers only: not built for the tower
    split_image_tensors = staticmethod(split_by_image)  # the processor's tensors, one dict per picture
    # what spelling a picture needs that transformers' processor leaves out of its output (Llama 4's tile grid):
    # where a family names any, its image processor and tokenizer are called apart (`runtime.multimodal.processor`)
    kept_image_inputs: tuple[str, ...] = ()
    text_placeholder: str | None = None  # what a prompt's text writes where a picture goes, where not its image token
    image_processor_steps = None  # the family's own image processor, where transformers' cannot be loaded

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        self.vision_tower = self.multi_modal_projector = None  # served text-only, none is built
        if config.vision_language is not None:
            self.build_tower(config.vision_language)

    def build_tower(self, checkpoint: PretrainedConfig) -> None:
        """Build the vision tower and projector from the checkpoint's whole config (a family whose tower has
        another name builds it in its own `__init__`)."""

    @classmethod
    def text_config(cls, config: PretrainedConfig) -> PretrainedConfig:
        text = language_model_config(config)
        text.vision_language = config  # what the tower is built from
        return text

    @classmethod
    def encoder_only(cls, config: PretrainedConfig) -> PretrainedConfig:
        """`config` (the language model's, `text_config`) for a model built for its vision encoder alone
        (`runtime.engine.image_encoder`): no decoder layers and a one-token vocabulary, so the language model
        built beside the tower costs next to nothing before it is dropped."""
        config = copy.copy(config)
        config.num_hidden_layers, config.vocab_size = 0, 1
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = []
        return config

    def encoder_tensor(self, name: str) -> bool:
        """Whether a checkpoint tensor belongs to what an encoder-only model holds: its tower and projector."""
        part = self.renamed(name).split(".", 1)[0]
        return part not in ("model", "lm_head") and getattr(self, part, None) is not None

    @classmethod
    def renamed(cls, name: str) -> str:
        """A checkpoint tensor's name as ours (`checkpoint_layout`)."""
        for prefix, ours in cls.checkpoint_layout:
            if name.startswith(prefix):
                return ours + name.removeprefix(prefix)
        return name

    # A picture's placeholder tokens, from its tensors and the checkpoint's config
    image_token_counts: Callable[[dict[str, torch.Tensor], PretrainedConfig], int]

    @classmethod
    def picture_tokens_of(cls, tensors: dict[str, torch.Tensor], checkpoint: PretrainedConfig, image_token: str
                          ) -> list[str]:
        """The tokens a picture is spelled out as, as its processor's `replace_image_token` writes them (checked
        against the processor's ids, or written so where it cannot be loaded: `runtime.multimodal.processor`)."""
        return [image_token] * cls.image_token_counts(tensors, checkpoint)
    # Each picture's placeholder rows, [tokens, the language model's hidden size]
    encode_images: Callable[[list[dict[str, torch.Tensor]]], list[torch.Tensor]]
