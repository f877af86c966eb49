"""What the router and the replicas call a request's prefix: chained hashes of its text's whole chunks.

The router (deployments/prefix_router.py) reads a request's route text and hashes it in CHUNK_CHARS-character
chunks, each hash chained from the last; the replica sends the same hashes with the request to its engine as
prefix marks (runtime.core.prefix_marks) and reports, through Serve's routing stats, the marks whose prefixes
its cache still holds: both sides name a prefix the same way without the router tokenizing anything. A chain
starts from the request's LoRA adapter and cache salt, as the engine's block hashes do, so a prefix another
adapter or tenant cached is not taken for the request's own.
"""

from dataclasses import replace
from hashlib import blake2b

from deployments.api.chat.protocol import ChatCompletionRequest, ChatMessage, ImagePart
from deployments.api.completions.protocol import CompletionRequest
from deployments.api.generate.protocol import GenerateRequest

CHUNK_CHARS = 64


def route_marks(request) -> tuple[int, ...]:
    """The chained chunk hashes of `request`'s route text (none for a request with no prompt to route by)."""
    return tuple(prefix_hashes(route_text(request), adapter_of(request), getattr(request, "cache_salt", None)))


def marked(valid, request):
    """`valid` (the runtime's ValidRequest for `request`'s first prompt) with the request's route marks, which its
    engine reports while it holds their prefixes."""
    return replace(valid, prefix_marks=route_marks(request))


def adapter_of(request) -> str | None:
    """The `<model>:<adapter>` a request names, if it names an adapter."""
    model = getattr(request, "model", None)
    return model if isinstance(model, str) and ":" in model else None


def prefix_hashes(text: str, adapter: str | None = None, salt: str | None = None) -> list[int]:
    """Chained hashes of the prompt text's whole CHUNK_CHARS-character chunks, from the adapter's name and the
    salt: the same in every process (the router's and the replicas'), unlike Python's `hash` of a string."""
    hashes, parent = [], _digest(f"{adapter}|{salt}".encode() if salt else str(adapter).encode())
    for end in range(CHUNK_CHARS, len(text) + 1, CHUNK_CHARS):
        parent = _digest(parent + text[end - CHUNK_CHARS : end].encode())
        hashes.append(int.from_bytes(parent, "little", signed=True))
    return hashes


def _digest(data: bytes) -> bytes:
    return blake2b(data, digest_size=8).digest()


def _content(message: ChatMessage) -> str:
    """A message's text, a picture written as its URL's digest (the same picture in the same place is the same
    prefix, as the engine's block hashes take pictures in)."""
    if not isinstance(message.content, list):
        return message.content or ""
    return "".join(f"<image {_digest(part.image_url.url.encode()).hex()}>" if isinstance(part, ImagePart) else part.text
                   for part in message.content)


def route_text(request) -> str:
    """The text that decides the route: the first prompt of the request ("" when there is none)."""
    if isinstance(request, ChatCompletionRequest):
        return "".join(f"<{m.role}>{_content(m)}" for m in request.messages)
    if isinstance(request, CompletionRequest):
        prompts = request.prompts()
    elif isinstance(request, GenerateRequest):
        prompts = request.prompts()[0]
    else:
        return ""
    if not prompts:
        return ""
    prompt = prompts[0]
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
