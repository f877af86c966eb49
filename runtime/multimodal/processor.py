"""A vision-language model's own processor (transformers' `AutoProcessor`, loaded from the checkpoint): a prompt's
text with one placeholder per picture becomes token ids with each picture's placeholder tokens spelled out (as many
as its family counts from its tensors, checked against the processor's ids), and each picture becomes the tensors
its encoder reads (an image may become several pictures: Gemma 3's pan-and-scan crops).

A processor that cannot be loaded (Qwen's load a video processor, which needs torchvision: not every torch build
has it), or whose output leaves out what a picture's spelling needs (Llama 4's), is replaced by its parts: the
checkpoint's image processor (or the family's own steps, where it too needs torchvision) and tokenizer, each
placeholder spelled out as the family spells the picture, as the processor's `replace_image_token` does."""

import logging
from pathlib import Path

import torch
from PIL import Image
from transformers import PretrainedConfig

from runtime.multimodal.inputs import ImageInput

logger = logging.getLogger(__name__)


class ImageProcessing:
    def __init__(self, path: Path | str, family, checkpoint: PretrainedConfig, options: dict | None = None):
        """`family`: the model's class (`runtime.models.vision_language.VisionLanguage`); `checkpoint`: its whole
        config; `options`: what the processor is called with beside the pictures (`mm_processor_kwargs`)."""
        self._options = options or {}
        # imported here: transformers' processors pull in its modeling stack, which a text model never needs
        from transformers import AutoProcessor, AutoTokenizer

        self._split = family.split_image_tensors
        self._spelled = lambda tensors: family.picture_tokens_of(tensors, checkpoint, self.image_token)
        self.processor = None
        if not family.kept_image_inputs:
            try:
                self.processor = AutoProcessor.from_pretrained(path)
            except Exception as e:
                logger.warning("the checkpoint's processor did not load (%s); its image processor and tokenizer do", e)
        if self.processor is not None:
            self.tokenizer, self.image_processor = self.processor.tokenizer, self.processor.image_processor
            self.placeholder = self.processor.image_token  # what a prompt's text writes where a picture goes
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.image_processor = load_image_processor(path, family)
            self.placeholder = (family.text_placeholder
                                or self.tokenizer.convert_ids_to_tokens(image_token_id(checkpoint)))
        self.image_token_id = image_token_id(checkpoint)  # a picture's rows (Gemma 3 writes another placeholder)
        self.image_token = self.tokenizer.convert_ids_to_tokens(self.image_token_id)
        self._input_names = [*self.image_processor.model_input_names, *family.kept_image_inputs]

    def process(self, text: str, images: list[Image.Image], add_special_tokens: bool = True
                ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids and its pictures' inputs; a ValueError when the text's placeholders and the
        pictures do not pair up."""
        written = text.count(self.placeholder)
        if written != len(images):
            raise ValueError(f"the prompt has {written} image placeholders ({self.placeholder!r}) for "
                             f"{len(images)} images")
        if self.processor is not None:
            batch = self.processor(text=[text], images=images, add_special_tokens=add_special_tokens,
                                   return_tensors="pt", **self._options)
        else:
            batch = self.image_processor(images=images, return_tensors="pt", **self._options)
        tensors = self._split({name: batch[name] for name in self._input_names if name in batch}, len(images))
        spelled = [self._spelled(t) for t in tensors]
        if self.processor is not None:
            ids = batch["input_ids"][0].tolist()
        else:  # as the processor's `replace_image_token`
            pieces = text.split(self.placeholder)
            text = pieces[0] + "".join("".join(tokens) + piece for tokens, piece in zip(spelled, pieces[1:]))
            ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        spans = placeholder_spans(ids, self.image_token_id, [self.tokenizer.convert_tokens_to_ids(t) for t in spelled])
        return ids, tuple(ImageInput(offset, length, ImageInput.hash_of(t), t, gaps)
                          for (offset, length, gaps), t in zip(spans, tensors))


def load_image_processor(path: Path | str, family):
    """The checkpoint's image processor; where transformers' cannot be loaded (Llama 4's needs torchvision), the
    family's own steps. An OSError (no processor files) is the caller's."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path)
    except OSError:
        raise
    except Exception as e:
        if family.image_processor_steps is None:
            raise
        logger.warning("the checkpoint's image processor did not load (%s); %s takes its steps",
                       str(e).strip().splitlines()[0], family.image_processor_steps.__name__)
        return family.image_processor_steps.from_pretrained(path)


def image_token_id(checkpoint: PretrainedConfig) -> int:
    """The token whose runs are the pictures' rows, as the checkpoint's config names it."""
    token_id = getattr(checkpoint, "image_token_id", None)
    return token_id if token_id is not None else checkpoint.image_token_index


def placeholder_spans(ids: list[int], token_id: int, pictures: list[list[int]]
                      ) -> list[tuple[int, int, tuple[int, ...]]]:
    """(first position, length, gaps) of each picture's tokens in `ids`: `pictures[i]` spelled out around the next
    `token_id` (two pictures with nothing between them make one run of both; a picture may open with other tokens,
    Llama 4's <|image_start|>); gaps: where its tokens are not `token_id`."""
    spans, position = [], 0
    for spelled in pictures:
        lead = spelled.index(token_id)
        try:
            start = ids.index(token_id, position + lead) - lead
        except ValueError:
            raise ValueError(f"the processor wrote image tokens for {len(spans)} of {len(pictures)} images") from None
        if ids[start : start + len(spelled)] != spelled:
            raise ValueError(f"image {len(spans)}'s tokens are not the {len(spelled)} its processor counts")
        spans.append((start, len(spelled), tuple(i for i, token in enumerate(spelled) if token != token_id)))
        position = start + len(spelled)
    return spans


def split_by_image(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """One dict per picture where every tensor has a row per picture (pixel_values [pictures, 3, H, W])."""
    return [{name: tensor[i : i + 1] for name, tensor in batch.items()} for i in range(count)]
