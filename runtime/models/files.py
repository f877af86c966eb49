"""Finding a model's files: a local directory, or a Hugging Face Hub id downloaded once."""

import os
from pathlib import Path

from runtime.errors import InvalidInputError

_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


def resolve_model_path(model: str) -> Path:
    """Return the local directory holding `model`'s config, tokenizer and safetensors.

    A path that looks local (absolute, relative with `./`, or existing) must be
    a directory; anything else is treated as a Hub id and fetched with
    `huggingface_hub.snapshot_download` (honouring HF_TOKEN and HF_HUB_OFFLINE).
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model.startswith(("/", "./", "../", "~")) or model.count("/") != 1:
        raise InvalidInputError("model", f"{model!r} is not a model directory or a Hugging Face Hub id")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=_PATTERNS, token=os.environ.get("HF_TOKEN")))
    except Exception as e:  # the hub's errors are many; the user needs the name and the cause
        raise InvalidInputError("model", f"could not find {model!r} locally or download it: {e}") from e
