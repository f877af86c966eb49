"""Conversations with pictures for the offline API (`LLM.chat`): content parts in OpenAI's shape (`text`, and
`image_url` with a base64 `data:` URL) or transformers' (`{"type": "image", "image": PIL.Image}`) become the
parts a vision-language model's chat template reads, and the pictures in their order."""

import base64

from PIL import Image

from runtime.multimodal.images import decode_image


def split_pictures(messages: list[dict], as_parts: bool) -> tuple[list[dict], list[Image.Image]]:
    """The messages as the chat template reads them (content as parts for a model that takes images, `as_parts`;
    text otherwise) and the pictures they hold."""
    pictures, rendered = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) and not as_parts:
            rendered.append(message)
            continue
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}] if content else []
        out = []
        for part in parts:
            if part["type"] in ("image_url", "image"):
                pictures.append(_picture(part))
                out.append({"type": "image"})
            else:
                out.append({"type": "text", "text": part["text"]})
        text = "".join(p["text"] for p in out if p["type"] == "text")
        rendered.append({**message, "content": out if as_parts else text})
    return rendered, pictures


def _picture(part: dict) -> Image.Image:
    if part["type"] == "image":
        return part["image"]
    url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
    header, _, payload = url.partition(",")
    if not (header.startswith("data:") and header.endswith(";base64")):
        raise ValueError("offline, an image_url must be a base64 data: URL")
    return decode_image(base64.b64decode(payload, validate=True))
