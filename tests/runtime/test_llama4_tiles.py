"""Llama 4's pictures as transformers' own processor makes them (run where torchvision imports:
`testing.torchvision_oracle`): our steps (`runtime.multimodal.llama4_tiles`) give the same tiles bit for bit, and
the family spells every picture out as the processor does (the same prompt ids), for pictures of one tile, of
several tiles beside the global tile, downscaled, wide, tall, tiny, with transparency and in greyscale."""

import numpy as np
import torch
from PIL import Image

from runtime.config import EngineConfig
from runtime.engine.validator import RequestValidator
from testing.torchvision_oracle import install_torchvision, run_processor
from testing.vision_checkpoints import build_llama4_dir, random_picture
from tests.runtime.test_vision_models import OPTIONS, conversation


def pictures() -> list[Image.Image]:
    transparent = np.random.default_rng(9).integers(0, 256, (50, 45, 4), dtype=np.uint8)
    return [random_picture(0), random_picture(1, (20, 20)), random_picture(2, (200, 30)),
            random_picture(3, (30, 200)), random_picture(4, (300, 250)), random_picture(5, (3, 2)),
            Image.fromarray(transparent, "RGBA"), random_picture(6, (60, 33)).convert("L")]


def test_tiles_and_spelling_equal_transformers_processor(tmp_path):
    path = build_llama4_dir(tmp_path / "llama4")
    files = []
    for i, picture in enumerate(pictures()):
        picture.save(tmp_path / f"{i}.png")
        files.append(tmp_path / f"{i}.png")
    validator = RequestValidator(EngineConfig(model=str(path), **OPTIONS, limit_mm_per_prompt={"image": len(files)}))
    text = validator.tokenizer.apply_chat_template(conversation(len(files)), tokenize=False,
                                                   add_generation_prompt=True)
    expected = run_processor(install_torchvision(tmp_path / "torchvision"), path, text, files, tmp_path / "out.pt")
    ids, images = validator.process_images(text, [Image.open(f) for f in files])
    assert ids == expected["input_ids"][0].tolist()
    assert [image.tensors["aspect_ratios"].view(-1).tolist() for image in images] == expected["aspect_ratios"].tolist()
    tiles = torch.cat([image.tensors["pixel_values"] for image in images])
    assert tiles.dtype == expected["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(tiles, expected["pixel_values"])
    grids = {tuple(image.tensors["aspect_ratios"].view(-1).tolist()) for image in images}
    assert {(1, 1), (2, 2), (1, 4), (4, 1)} <= grids  # one tile, and grids of several each way
