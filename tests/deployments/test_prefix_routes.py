"""What the prefix-aware router hashes a chat by: its text, each picture as its URL's hash, so the same picture in
the same place routes as the same prefix and another picture shares only the prefix before it."""

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.prefix_router import CHUNK_CHARS, prefix_hashes, route_text
from testing.vision_checkpoints import data_url, random_picture

TEXT = "Describe this picture in the words a careful museum curator would choose for its label. "


def chat(picture_url: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": TEXT}, {"type": "image_url", "image_url": {"url": picture_url}},
        {"type": "text", "text": TEXT}]}])


def test_pictures_are_part_of_the_route():
    first, again, other = (prefix_hashes(route_text(chat(data_url(random_picture(seed))))) for seed in (1, 1, 2))
    before_picture = len(f"<user>{TEXT}") // CHUNK_CHARS  # chunks wholly before the picture
    assert first == again
    assert first[:before_picture] == other[:before_picture] and first[before_picture] != other[before_picture]
    assert len(first) == len(other) > before_picture + 1
