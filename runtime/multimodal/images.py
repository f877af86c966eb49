"""A picture's bytes decoded into an RGB image, within bounds: a file that is not an image, is cut short, declares
more pixels than allowed (a decompression bomb: a small file of an enormous size) or is in a format not taken is
refused with a ValueError that says which."""

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # what clients send; others (TIFF, PSD, EPS...) are refused


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20  # of the encoded file
    max_pixels: int = 40_000_000  # width x height, checked from the header before any pixel is decoded


def decode_image(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    if len(data) > limits.max_bytes:
        raise ValueError(f"the image is {len(data)} bytes, over the {limits.max_bytes} allowed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if width * height > limits.max_pixels:
                raise ValueError(f"the image is {width}x{height} pixels, over the {limits.max_pixels} allowed")
            if width == 0 or height == 0:
                raise ValueError("the image has no pixels")
            image.load()  # decodes now, so a truncated file fails here
            return image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"not an image in a supported format ({', '.join(FORMATS)}): {e}") from None
    except (OSError, SyntaxError, EOFError) as e:  # PIL's truncated or corrupt data
        raise ValueError(f"the image could not be decoded: {e}") from None
