"""Tiny random-weight vision-language checkpoints, saved as their publishers ship them (config, weights, tokenizer
and the processor's files), and test pictures.

The tokenizer is the test tokenizer with the family's image token added; its chat template is ChatML that writes
the image token where a message's content lists a picture (as the families' own templates do).
"""

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import (
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3Processor,
    GenerationConfig,
    Llama4Config,
    Llama4ForConditionalGeneration,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from testing.model_factory import FAMILY_FIELDS, build_tokenizer

# ChatML over content that is a string or a list of parts ({"type": "text", "text": ...} / {"type": "image"})
VISION_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ image_token }}{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_llava_dir(path: Path, image_size: int = 28, patch_size: int = 7, seed: int = 0,
                    vision: dict | None = None, text: dict | None = None) -> Path:
    """LLaVA-1.5's shape at a tiny size: a 3-layer CLIP tower read at its second-to-last layer, class token
    dropped, a GELU projector, a Qwen2 language model; (image_size / patch_size)^2 tokens a picture. `vision` and
    `text` override the tower's and the language model's config fields (a benchmark's larger shapes)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = VISION_CHATML.replace("{{ image_token }}", "<image>")
    vision = CLIPVisionConfig(**{**dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, image_size=image_size, patch_size=patch_size,
                                        projection_dim=32, initializer_factor=4.0), **(vision or {})})
    text = Qwen2Config(**{**dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=576, max_position_embeddings=2048,
                                 initializer_range=0.2, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>")),
                          **(text or {})})
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(
        "<image>"), projector_hidden_act="gelu", vision_feature_layer=-2, vision_feature_select_strategy="default",
        initializer_range=0.2)
    model = LlavaForConditionalGeneration(config)
    model.save_pretrained(path)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                            crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=tokenizer.chat_template)
    processor.save_pretrained(path)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


GEMMA3_VISION_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                        "image_token": "<image_soft_token>"}


def build_gemma3_dir(path: Path, seed: int = 0) -> Path:
    """Gemma 3's shape at a tiny size: a 2-layer SigLIP tower over 56-pixel pictures in 7-pixel patches, averaged
    2 x 2 into 16 tokens a picture, a sliding layer (window 8: shorter than a picture) and a full one. The prompt
    writes <start_of_image>, which the processor spells out with the picture's soft tokens between the begin and
    end tokens. Its projection is drawn at random (transformers starts it at zero) and its embeddings untied (tied,
    a random model's next token is mostly its last)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA3_VISION_TOKENS.values())})
    tokenizer._set_model_specific_special_tokens(GEMMA3_VISION_TOKENS)  # boi_token, eoi_token, image_token
    tokenizer.chat_template = VISION_CHATML.replace("{{ image_token }}", GEMMA3_VISION_TOKENS["boi_token"])
    ids = {name: tokenizer.convert_tokens_to_ids(GEMMA3_VISION_TOKENS[token]) for name, token in (
        ("boi_token_index", "boi_token"), ("eoi_token_index", "eoi_token"), ("image_token_index", "image_token"))}
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=576, max_position_embeddings=2048, sliding_window=8,
                layer_types=["sliding_attention", "full_attention"], initializer_range=0.2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56,
                  patch_size=7, vision_use_head=False)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16, initializer_range=0.2,
                          tie_word_embeddings=False,
                          eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), **ids)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    model.save_pretrained(path)
    image_processor = Gemma3ImageProcessorPil(size={"height": 56, "width": 56})
    Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16,
                    chat_template=tokenizer.chat_template).save_pretrained(path)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


PIXTRAL_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def build_mistral3_dir(path: Path, seed: int = 0) -> Path:
    """Mistral 3's shape at a tiny size: a 2-layer Pixtral tower over 4-pixel patches, merged 2 x 2, read at its
    last layer, and a Mistral language model; pictures resized to at most 48 pixels a side, in multiples of 8.
    Saved as Mistral publishes it, processor_config.json included; transformers' Pixtral processor needs
    torchvision (which the CPU torch build here cannot load), so its image processor is saved alone."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": PIXTRAL_TOKENS})
    tokenizer.chat_template = VISION_CHATML.replace("{{ image_token }}", "[IMG]")
    text = dict(model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=576,
                max_position_embeddings=2048, initializer_range=0.2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=64,
                  patch_size=4, head_dim=8)
    config = Mistral3Config(text_config=text, vision_config=vision, spatial_merge_size=2, vision_feature_layer=-1,
                            image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), initializer_range=0.2)
    Mistral3ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    PixtralImageProcessorPil(patch_size={"height": 8, "width": 8}, size={"longest_edge": 48}).save_pretrained(path)
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "PixtralProcessor", "patch_size": 4, "spatial_merge_size": 2, "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


LLAMA4_TOKENS = ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                 "<|tile_y_separator|>"]


def build_llama4_dir(path: Path, seed: int = 0) -> Path:
    """Llama 4's shape at a tiny size: pictures cut into tiles of 28 pixels (at most 4, and a global tile beside
    several), a 2-layer tower over 7-pixel patches whose 4 x 4 grid a pixel shuffle folds into 4 rows a tile, and
    Llama 4's language model (chunks of 32 positions on three layers of four, experts on every second). Saved as
    Meta publishes it: preprocessor_config.json and processor_config.json beside the weights and tokenizer."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA4_TOKENS})
    tokenizer.chat_template = VISION_CHATML.replace("{{ image_token }}", "<|image|>")
    text = dict(FAMILY_FIELDS["llama4"], hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=576,
                max_position_embeddings=2048, initializer_range=0.2)
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=7, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64,
                  initializer_range=0.2)
    config = Llama4Config(text_config=text, vision_config=vision,
                          image_token_index=tokenizer.convert_tokens_to_ids("<|patch|>"))
    Llama4ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Llama4ImageProcessorFast", "processor_class": "Llama4Processor",
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_patches": 4, "resample": 2,
        "rescale_factor": 1 / 255, "resize_to_max_canvas": False, "size": {"height": 28, "width": 28}}))
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "Llama4Processor", "fake_image_token": "<|image|>", "image_token": "<|image|>",
        "patch_size": 7}))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


QWEN_VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# what the Qwen checkpoints below share: a 2-layer language model of width 64, and a tower of width 32 over 4-pixel
# patches in 2 x 2 merges
_QWEN_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=576, max_position_embeddings=2048, initializer_range=0.2)
_QWEN_VISION = dict(num_heads=4, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, initializer_range=0.2)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def build_qwen2_5_vl_dir(path: Path, seed: int = 0) -> Path:
    """Qwen2.5-VL's shape at a tiny size: 4-pixel patches in 2 x 2 merges, a 2-block tower (the first attending
    within windows of 2 x 2 merged patches, the second over the whole picture), a Qwen2 language model rotating by
    M-RoPE; saved as Qwen publishes it, but for the processor's video half (it needs torchvision, which the CPU
    torch build here cannot load): the image processor and tokenizer."""
    return _build_qwen(path, seed, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                       text=dict(rope_parameters={**_ROPE, "mrope_section": [2, 3, 3]}),
                       vision=dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=16,
                                   fullatt_block_indexes=[1]))


def build_qwen2_vl_dir(path: Path, seed: int = 0) -> Path:
    """Qwen2-VL's shape at a tiny size: Qwen2.5-VL's (`build_qwen2_5_vl_dir`) with Qwen2-VL's tower (LayerNorm blocks
    over the whole picture; its width is `embed_dim`, `hidden_size` the language model's)."""
    return _build_qwen(path, seed, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                       text=dict(rope_parameters={**_ROPE, "mrope_section": [2, 3, 3]}),
                       vision=dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2))


_QWEN3_5_TEXT = dict(FAMILY_FIELDS["qwen3_5"], head_dim=32,
                     rope_parameters={**_ROPE, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                      "mrope_interleaved": True})
_QWEN3_5_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_position_embeddings=16)


def build_qwen3_5_dir(path: Path, seed: int = 0) -> Path:
    """Qwen3.5's shape at a tiny size: a linear-attention layer then a gated full-attention one rotating a quarter
    of each head by interleaved M-RoPE, and a 2-block tower over 4-pixel patches (a 4 x 4 grid of learned
    positions, resized to each picture), 2 x 2 merges; the processor's image half and tokenizer, as for
    Qwen2.5-VL."""
    return _build_qwen(path, seed, Qwen3_5Config, Qwen3_5ForConditionalGeneration, text=_QWEN3_5_TEXT,
                       vision=_QWEN3_5_VISION)


def build_qwen3_5_moe_dir(path: Path, seed: int = 0) -> Path:
    """Qwen3.5-MoE's shape at a tiny size: Qwen3.5's (`build_qwen3_5_dir`) with 4 experts (top 2) and a gated
    shared expert on both layers."""
    return _build_qwen(path, seed, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration,
                       text=dict(_QWEN3_5_TEXT, **FAMILY_FIELDS["qwen3_5_moe"]),
                       vision=_QWEN3_5_VISION)


def build_qwen3_vl_dir(path: Path, seed: int = 0) -> Path:
    """Qwen3-VL's shape at a tiny size: Qwen3's language model (q/k norms) rotating by interleaved M-RoPE, and
    Qwen3.5's tower (`build_qwen3_5_dir`) of 3 blocks tapped after the first two (deep stack)."""
    return _build_qwen(path, seed, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                       text=dict(head_dim=16, rope_parameters={**_ROPE, "mrope_section": [3, 3, 2],
                                                               "mrope_interleaved": True}),
                       vision=dict(depth=3, hidden_size=32, intermediate_size=64, out_hidden_size=64,
                                   num_position_embeddings=16, deepstack_visual_indexes=[0, 1]))


def _build_qwen(path: Path, seed: int, config_class, model_class, text: dict, vision: dict) -> Path:
    """A Qwen vision-language checkpoint of `_QWEN_TEXT` and `_QWEN_VISION` with the family's fields over them,
    saved with the tokenizer (the vision tokens added) and the image processor (pictures up to 64 x 64 pixels)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VISION_TOKENS})
    tokenizer.chat_template = VISION_CHATML.replace("{{ image_token }}", "<|vision_start|><|image_pad|><|vision_end|>")
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(
        ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), QWEN_VISION_TOKENS)}
    config = config_class(text_config={**_QWEN_TEXT, **text}, vision_config={**_QWEN_VISION, **vision},
                          initializer_range=0.2, **ids)
    model_class(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=8 * 8,
                             max_pixels=64 * 64).save_pretrained(path)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


def random_picture(seed: int, size: tuple[int, int] = (40, 32)) -> Image.Image:
    """A random RGB picture (width, height)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def encoded(picture: Image.Image, format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format=format)
    return buffer.getvalue()


def data_url(picture: Image.Image, format: str = "PNG") -> str:
    return f"data:image/{format.lower()};base64,{base64.b64encode(encoded(picture, format)).decode()}"


def declared_size_png(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header declares `width` x `height` pixels (a decompression bomb's shape:
    its pixels are never there)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")
