"""What names a model's weights the same in every replica that holds the same ones (`BlockManager.weights_version`,
which starts every prefix's hash chain, so a KV block shared between replicas is only ever served to one with the
same weights): a fingerprint of the checkpoint as loaded, then each update's version.

The fingerprint reads the checkpoint's config, each weight file's name and size, and samples of its bytes spread
evenly across the whole file (every `_STRIDE` bytes, at most `_SAMPLES` a file), not every byte: a checkpoint
differing from another only between samples would take its name. A trainer that names its updates
(`weight_version`) needs no fingerprint."""

import uuid
from hashlib import blake2b
from pathlib import Path

_SAMPLE = 4096  # bytes read at each sample
_STRIDE = 8 << 20  # the least distance between two samples
_SAMPLES = 64  # at most, a file


def checkpoint_fingerprint(path: Path, serving: str) -> str:
    """The fingerprint of the checkpoint at `path`, served as `serving` describes (dtype, KV cache dtype,
    quantization: the same weights served otherwise make other keys and values)."""
    digest = blake2b(serving.encode(), digest_size=16)
    for file in sorted(path.iterdir()):
        if file.name == "config.json":
            digest.update(file.read_bytes())
        elif file.suffix in (".safetensors", ".bin", ".pt"):
            size = file.stat().st_size
            digest.update(f"{file.name}:{size}".encode())
            with file.open("rb") as f:
                for offset in range(0, size, max(_STRIDE, -(-size // _SAMPLES))):
                    f.seek(offset)
                    digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def updated_version(previous: str, named: str | None) -> str:
    """The version after an update of tensors the trainer sent (all or some of them): its `named` version chained
    to the one before (replicas in step stay in step); unnamed, one of its own that no other replica takes."""
    if named is None:
        return f"unnamed {uuid.uuid4().hex}"
    return blake2b(f"{previous}|{named}".encode(), digest_size=16).hexdigest()
