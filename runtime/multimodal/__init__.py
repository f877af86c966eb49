"""Images in prompts: decoding them within bounds (`images`), the model's own processor turning a prompt's text and
pictures into token ids and pixel tensors (`processor`), what a request carries per picture (`inputs`), and the
encoder outputs the engine keeps until chunked prefill has consumed them (`encoder_cache`)."""

from runtime.multimodal.images import ImageLimits, decode_image
from runtime.multimodal.inputs import ImageInput, image_hashes_in
from runtime.multimodal.processor import ImageProcessing

__all__ = ["ImageInput", "ImageLimits", "ImageProcessing", "decode_image", "image_hashes_in"]
