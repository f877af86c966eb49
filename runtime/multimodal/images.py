"""A picture's bytes decoded into an image, within bounds: a file that is not an image, is cut short, declares more
pixels than allowed (a decompression bomb: a small file of an enormous size) or so long and thin a shape that a
processor's resize to its shorter side would blow it up, or is in a format not taken, is refused with a ValueError
that says which. Its mode is left as the file has it: the model's processor converts it to RGB as it does for
transformers (an alpha channel included)."""

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # what clients send; others (TIFF, PSD, EPS...) are refused


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20  # of the encoded file
    max_pixels: int = 40_000_000  # width x height, checked from the header before any pixel is decoded
    max_aspect_ratio: float = 200.0  # the longer side over the shorter (as Qwen's processors bound it)


def decode_image(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    if len(data) > limits.max_bytes:
        raise ValueError(f"the image is {len(data)} bytes, over the {limits.max_bytes} allowed")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as e:  # PIL's own bound, past ours
        raise ValueError(f"the image declares too many pixels: {e}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError) as e:
        raise ValueError(f"not an image in a supported format ({', '.join(FORMATS)}): {e}") from None
    width, height = image.size
    if width == 0 or height == 0:
        raise ValueError("the image has no pixels")
    if width * height > limits.max_pixels:
        raise ValueError(f"the image is {width}x{height} pixels, over the {limits.max_pixels} allowed")
    if max(width, height) / min(width, height) > limits.max_aspect_ratio:
        raise ValueError(f"the image is {width}x{height} pixels: its longer side is over {limits.max_aspect_ratio:g} "
                         "times its shorter")
    try:
        image.load()  # decodes now, so a truncated file fails here
    except (OSError, SyntaxError, EOFError, ValueError) as e:  # PIL's truncated or corrupt data
        raise ValueError(f"the image could not be decoded: {e}") from None
    return image
