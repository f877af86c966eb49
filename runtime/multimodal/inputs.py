"""What a request carries per picture: where its tokens lie in the prompt, the tensors its encoder reads, and a
hash of its content, which the prefix cache's block hashes take in."""

from dataclasses import dataclass, field
from hashlib import blake2b

import torch


@dataclass(frozen=True)
class ImageInput:
    offset: int  # the prompt position of the picture's first placeholder token
    length: int  # its placeholder tokens: the rows its encoder output fills
    content_hash: int  # of its pixels as the processor made them (the same picture hashes the same, whatever its file)
    tensors: dict[str, torch.Tensor] = field(repr=False, compare=False)  # what its encoder reads (pixel_values...)

    @property
    def end(self) -> int:
        return self.offset + self.length

    @staticmethod
    def hash_of(tensors: dict[str, torch.Tensor]) -> int:
        digest = blake2b(digest_size=8)
        for name in sorted(tensors):
            tensor = tensors[name].contiguous()
            digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
        return int.from_bytes(digest.digest(), "little")


def image_hashes_in(images: tuple[ImageInput, ...], start: int, end: int) -> tuple[int, ...]:
    """The content hashes of the pictures whose tokens lie (partly) within positions [start, end)."""
    return tuple(image.content_hash for image in images if image.offset < end and start < image.end)
