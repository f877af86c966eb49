"""The vision encoder's outputs, kept on rank 0 from the step whose prefill chunk first reaches a picture until a
chunk has consumed its last token: a picture's tokens may span several chunks, and it is encoded once.

A step's pictures that are not held yet are encoded together (the model batches them); a picture that arrives
encoded (by the model's encoder deployment: `ImageInput.encoded`) is held as it came. An entry goes as soon as
its picture is consumed, or at the next step once its request has no running sequence (it finished, was aborted
or was preempted: a preempted request's pictures are encoded again when it is), so the cache holds at most the
pictures of the running requests' prefills in progress."""

import torch

from runtime.core.sequence import Request, SequenceStatus
from runtime.errors import describe


class EncoderCache:
    def __init__(self, encode, device: torch.device, dtype: torch.dtype):
        """`encode(pictures)`: the model's encoder outputs, [placeholder tokens, hidden] for each picture's tensors
        (`dtype`: the model's)."""
        self._encode = encode
        self._device, self._dtype = device, dtype
        self._outputs: dict[Request, dict[int, torch.Tensor]] = {}
        self.images_encoded = 0  # over the cache's life
        self.images_received = 0  # encoded elsewhere, over the cache's life
        self.failed: dict[Request, str] = {}  # requests whose pictures the encoder refused this step: why

    def __len__(self) -> int:
        return sum(len(held) for held in self._outputs.values())

    def rows(self, chunks: list[tuple[Request, int, int, int]]) -> tuple[list[int], torch.Tensor | None]:
        """For the step's prefill chunks (request, first position, end position, first row in the step), the rows
        whose input is a picture's output rather than its placeholder token's embedding, and those outputs."""
        self._sweep()
        self.failed = {}
        missing = [(request, i) for request, start, end, _ in chunks for i, image in enumerate(request.images)
                   if image.offset < end and start < image.end and i not in self._outputs.get(request, ())]
        if missing:
            self._fill(missing)
        rows: list[int] = []
        pieces = []
        consumed = []
        for request, start, end, first in chunks:
            if request in self.failed:  # its rows keep their placeholders' embeddings; its output is dropped
                continue
            for i, image in enumerate(request.images):
                if not (image.offset < end and start < image.end):
                    continue
                positions, output_rows = image.rows_within(start, end)
                pieces.append(self._outputs[request][i][output_rows])
                rows.extend(first + p - start for p in positions)
                if end >= image.end:
                    consumed.append((request, i))
        for request, i in consumed:
            held = self._outputs.get(request)
            if held is not None and held.pop(i, None) is not None and not held:
                del self._outputs[request]
        return rows, torch.cat(pieces) if pieces else None

    def _fill(self, missing: list[tuple[Request, int]]) -> None:
        """Hold the pictures that came encoded; encode the others in one batch, and if that raises, one at a time,
        so only the requests whose pictures raise fail."""
        missing = list(dict.fromkeys(missing))  # siblings of one request need its picture once
        for request, i in [(r, i) for r, i in missing if r.images[i].encoded is not None]:
            try:
                self._store([(request, i)], [request.images[i].encoded.to(self._device, self._dtype)])
            except ValueError as e:
                self.failed[request] = f"its image {i} came encoded wrongly: {e}"
            else:
                self.images_received += 1
        missing = [(request, i) for request, i in missing if request.images[i].encoded is None]
        if missing:
            with torch.inference_mode():
                self._fill_each(missing)

    def _fill_each(self, missing: list[tuple[Request, int]]) -> None:
        try:
            self._store(missing, self._encode([self._tensors(request, i) for request, i in missing]))
            self.images_encoded += len(missing)
        except Exception:
            for request, i in missing:
                try:
                    self._store([(request, i)], self._encode([self._tensors(request, i)]))
                    self.images_encoded += 1
                except Exception as e:
                    self.failed[request] = f"its image {i} could not be encoded: {describe(e)}"

    def _tensors(self, request: Request, i: int) -> dict[str, torch.Tensor]:
        return {name: t.to(self._device) for name, t in request.images[i].tensors.items()}

    def _store(self, pictures: list[tuple[Request, int]], outputs: list[torch.Tensor]) -> None:
        for (request, i), output in zip(pictures, outputs, strict=True):
            expected = request.images[i].num_rows
            if output.shape[0] != expected:
                raise ValueError(f"the encoder gave {output.shape[0]} rows for a picture of {expected}")
        for (request, i), output in zip(pictures, outputs):
            self._outputs.setdefault(request, {})[i] = output

    def release(self, request: Request) -> None:
        """Let go of `request`'s pictures now (it ended before its prefill did: aborted, failed; the next step
        would let go of them, but an idle engine takes none)."""
        self._outputs.pop(request, None)

    def stats(self) -> dict:
        return {"encoder_cache_images": len(self), "images_encoded": self.images_encoded,
                "images_received": self.images_received}

    def _sweep(self) -> None:
        """Let go of the pictures of requests that no longer run."""
        running = SequenceStatus.RUNNING
        for request in [r for r in self._outputs if not any(s.status is running for s in r.seqs)]:
            del self._outputs[request]


class NoEncoder:
    """A text-only model's encoder cache: no picture to encode, hold or let go of."""

    failed: dict[Request, str] = {}

    def __len__(self) -> int:
        return 0

    def rows(self, chunks: list) -> tuple[list[int], None]:
        return [], None

    def release(self, request: Request) -> None:
        pass

    def stats(self) -> dict:
        return {}


def encoder_cache_of(model, spec, device: torch.device) -> EncoderCache | NoEncoder:
    """A model's encoder cache: its own encoder's, or none for a model serving text only (`spec`: its ModelSpec)."""
    return EncoderCache(model.encode_images, device, spec.dtype) if spec.takes_images else NoEncoder()
