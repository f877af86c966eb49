"""What a request carries per picture: where its tokens lie in the prompt, the tensors its encoder reads, and a
hash of its content, which the prefix cache's block hashes take in."""

from bisect import bisect_left
from dataclasses import dataclass, field, replace
from hashlib import blake2b

import torch


@dataclass(frozen=True)
class ImageInput:
    offset: int  # the prompt position of the picture's first placeholder token
    length: int  # its tokens, from the first placeholder to the last
    content_hash: int  # of its pixels as the processor made them (the same picture hashes the same, whatever its file)
    tensors: dict[str, torch.Tensor] = field(repr=False, compare=False)  # what its encoder reads (pixel_values...)
    # positions (from `offset`) of its tokens that keep their own embeddings (Pixtral's row breaks); every other
    # token's row is the encoder's output, in order
    gaps: tuple[int, ...] = ()
    # its encoder's output, [num_rows, hidden], when an encoder deployment computed it (its tensors then left out):
    # the engine takes it as is
    encoded: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def replaced_by(self, encoded: torch.Tensor) -> "ImageInput":
        """This picture with its encoder's output in place of the tensors it was computed from."""
        return replace(self, tensors={}, encoded=encoded)

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def num_rows(self) -> int:
        """The rows its encoder outputs."""
        return self.length - len(self.gaps)

    def rows_within(self, start: int, end: int) -> tuple[list[int], list[int]]:
        """Of prompt positions [start, end): those the encoder's output fills, and which of its rows fill them."""
        positions = [p for p in range(max(start, self.offset), min(end, self.end)) if p - self.offset not in self.gaps]
        return positions, [p - self.offset - bisect_left(self.gaps, p - self.offset) for p in positions]

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
