"""Llama 4's image processor, by its steps: transformers' `Llama4ImageProcessor` needs torchvision, which not every
torch build can load (checked equal to it in tests/runtime/test_llama4_tiles.py). A picture is resized, keeping its
shape, into the canvas of tiles (at most `max_patches` tiles of `size`) that needs the least resizing, upscaling no
side past one tile, padded with black to the canvas, scaled to [0, 1] and normalized in bfloat16, and cut into
tiles in raster order; beside several tiles, the whole picture squeezed into one tile (the global tile) comes
last. Resizing is bilinear with antialiasing on the pixels' bytes, as torchvision does on x86 and ARM CPUs."""

from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from transformers.image_processing_base import ImageProcessingMixin
from transformers.image_transforms import convert_to_rgb


class Llama4Tiles:
    model_input_names = ["pixel_values"]  # as transformers' (the family keeps `aspect_ratios` too)

    def __init__(self, size: dict | None = None, max_patches: int = 16, resize_to_max_canvas: bool = False,
                 image_mean: list[float] = (0.5, 0.5, 0.5), image_std: list[float] = (0.5, 0.5, 0.5),
                 rescale_factor: float = 1 / 255, **_):
        self.tile = (size or {"height": 336})["height"]
        self.max_patches, self.resize_to_max_canvas = max_patches, resize_to_max_canvas
        self.mean, self.std, self.rescale_factor = list(image_mean), list(image_std), rescale_factor

    @classmethod
    def from_pretrained(cls, path: Path | str) -> "Llama4Tiles":
        """From the checkpoint's preprocessor_config.json, or the `image_processor` in its processor_config.json
        (where transformers 5 saves it); an OSError where it has neither."""
        return cls(**ImageProcessingMixin.get_image_processor_dict(path)[0])

    def __call__(self, images: list[Image.Image], max_patches: int | None = None,
                 resize_to_max_canvas: bool | None = None, **_) -> dict[str, torch.Tensor]:
        """Every picture's tiles, one after another [tiles, 3, size, size], and each picture's tile grid
        [pictures, 2] (rows, columns), as transformers' processor returns them."""
        canvases = torch.tensor(canvas_sizes(self.max_patches if max_patches is None else max_patches, self.tile))
        to_max = self.resize_to_max_canvas if resize_to_max_canvas is None else resize_to_max_canvas
        tiles, grids = [], []
        for image in images:
            pixels = torch.from_numpy(convert_to_rgb(image, return_numpy=True)).permute(2, 0, 1).contiguous()[None]
            picture, grid = self._tiles(pixels, canvases, to_max)
            tiles.append(picture)
            grids.append(grid)
        return {"pixel_values": torch.cat(tiles), "aspect_ratios": torch.tensor(grids)}

    def _tiles(self, pixels: torch.Tensor, canvases: torch.Tensor, to_max: bool) -> tuple[torch.Tensor, list[int]]:
        height, width = pixels.shape[-2:]
        canvas = best_canvas((height, width), canvases, to_max)
        bound = canvas if to_max else [min(max(side, self.tile), limit) for side, limit in zip((height, width), canvas)]
        resized = _resize(pixels, fit_within((height, width), bound))
        padded = F.pad(resized, (0, canvas[1] - resized.shape[-1], 0, canvas[0] - resized.shape[-2]))
        rows, columns = canvas[0] // self.tile, canvas[1] // self.tile
        tiles = (self._normalized(padded).view(3, rows, self.tile, columns, self.tile)
                 .permute(1, 3, 0, 2, 4).reshape(rows * columns, 3, self.tile, self.tile))
        if rows * columns > 1:
            tiles = torch.cat([tiles, self._normalized(_resize(pixels, (self.tile, self.tile)))[None]])
        return tiles, [rows, columns]

    def _normalized(self, pixels: torch.Tensor) -> torch.Tensor:
        image = pixels[0].to(torch.bfloat16) * self.rescale_factor
        mean = torch.tensor(self.mean, dtype=torch.bfloat16).view(-1, 1, 1)
        return (image - mean) / torch.tensor(self.std, dtype=torch.bfloat16).view(-1, 1, 1)


def canvas_sizes(max_tiles: int, tile: int) -> list[tuple[int, int]]:
    """Every canvas of at most `max_tiles` tiles, (height, width) in pixels, in transformers' order (grouped by
    aspect ratio in the order each ratio first appears, from the most tiles down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_tiles, 0, -1):
        for rows in sorted(d for d in range(1, count + 1) if count % d == 0):
            by_ratio.setdefault(rows / (count // rows), []).append((rows * tile, count // rows * tile))
    return [canvas for canvases in by_ratio.values() for canvas in canvases]


def best_canvas(size: tuple[int, int], canvases: torch.Tensor, to_max: bool) -> list[int]:
    """The canvas needing the least upscaling (the most, `to_max`), or failing any, the least downscaling, to fit
    the picture undistorted; of equals, the smallest."""
    scales = torch.minimum(canvases[:, 0] / size[0], canvases[:, 1] / size[1])
    up = scales[scales >= 1]
    chosen = (up.max() if to_max else up.min()) if len(up) else scales[scales < 1].max()
    fits = canvases[scales == chosen]
    return fits[torch.argmin(fits[:, 0] * fits[:, 1])].tolist()


def fit_within(size: tuple[int, int], bound: list[int]) -> tuple[int, int]:
    """The largest size of the picture's shape within `bound` (rounded down), each side at least 1."""
    (height, width), (bound_height, bound_width) = size, bound
    if bound_width / width < bound_height / height:
        return max(min(int(height * (bound_width / width)), bound_height), 1), max(bound_width, 1)
    return max(bound_height, 1), max(min(int(width * (bound_height / height)), bound_width), 1)


def _resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(pixels.shape[-2:]) == tuple(size):
        return pixels
    return F.interpolate(pixels, size=list(size), mode="bilinear", align_corners=False, antialias=True)
