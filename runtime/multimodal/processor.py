"""A vision-language model's own processor (transformers' `AutoProcessor`, loaded from the checkpoint): a prompt's
text with one placeholder per picture becomes token ids with each picture's placeholder tokens spelled out (as many
as the processor counts for its size: `_get_num_multimodal_tokens`, which vLLM reads too), and each picture becomes
the tensors its encoder reads."""

from pathlib import Path

import torch
from PIL import Image
from transformers import AutoProcessor

from runtime.multimodal.inputs import ImageInput


class ImageProcessing:
    def __init__(self, path: Path | str, split_tensors):
        """`split_tensors(batch, count)`: the processor's tensors for `count` pictures, one dict per picture (the
        model family says how they are laid out)."""
        self.processor = AutoProcessor.from_pretrained(path)
        tokenizer = self.processor.tokenizer
        self.placeholder = self.processor.image_token  # what a prompt's text writes where a picture goes
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.processor.image_token)
        self._input_names = self.processor.image_processor.model_input_names
        self._split = split_tensors

    def process(self, text: str, images: list[Image.Image], add_special_tokens: bool = True
                ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids and its pictures' inputs; a ValueError when the text's placeholders and the
        pictures do not pair up."""
        written = text.count(self.placeholder)
        if written != len(images):
            raise ValueError(f"the prompt has {written} image placeholders ({self.placeholder!r}) for "
                             f"{len(images)} images")
        if not images:
            return self.processor.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"], ()
        batch = self.processor(text=[text], images=images, add_special_tokens=add_special_tokens,
                               return_tensors="pt")
        ids = batch["input_ids"][0].tolist()
        counts = self.processor._get_num_multimodal_tokens(image_sizes=[(i.height, i.width) for i in images])
        spans = placeholder_spans(ids, self.image_token_id, counts.num_image_tokens)
        tensors = self._split({name: batch[name] for name in self._input_names if name in batch}, len(images))
        return ids, tuple(ImageInput(offset, length, ImageInput.hash_of(t), t)
                          for (offset, length), t in zip(spans, tensors))


def placeholder_spans(ids: list[int], token_id: int, counts: list[int]) -> list[tuple[int, int]]:
    """(first position, length) of each picture's run of `token_id` in `ids`, the pictures `counts[i]` tokens each
    (two pictures with nothing between them make one run of both)."""
    spans, position = [], 0
    for count in counts:
        try:
            start = ids.index(token_id, position)
        except ValueError:
            raise ValueError(f"the processor wrote image tokens for {len(spans)} of {len(counts)} images") from None
        if ids[start : start + count] != [token_id] * count:
            raise ValueError(f"image {len(spans)}'s tokens are not the {count} its processor counts")
        spans.append((start, count))
        position = start + count
    return spans


def split_by_image(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """One dict per picture where every tensor has a row per picture (pixel_values [pictures, 3, H, W])."""
    return [{name: tensor[i : i + 1] for name, tensor in batch.items()} for i in range(count)]
