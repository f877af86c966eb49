"""Attention in which a picture's tokens see each other both ways (Gemma 3), the rest staying causal: a query of a
picture also sees the picture's later keys. Under a layer's window a key is seen when it lies less than `window`
positions before the query, as transformers composes the two masks (a later key of the picture always is).

The step's backend attends causally first; then each picture's rows are attended again, here, over the cache,
which holds the whole picture by then: the scheduler never ends a prefill chunk inside such a picture (a cached
prefix may end inside one: its rows were computed seeing the whole picture, which the hash of their blocks
names)."""

from dataclasses import dataclass, field

import torch

from kernels.attention.torch_backend import masked_attention, read_slots
from kernels.transfer import to_device


@dataclass(frozen=True)
class PictureRows:
    """A picture's rows in a step: its queries are positions [first, end), the step's rows from `row` on; its
    tokens are positions [start, end) of the sequence whose block table is `block_table`."""

    row: int
    first: int
    start: int
    end: int
    block_table: list[int]


@dataclass
class PictureAttention:
    pictures: list[PictureRows]
    block_size: int
    device: torch.device
    # per window: each picture's keys' cache slots, and which keys each of its queries sees
    _reads: dict[int | None, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def attend(self, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               scale: float, window: int | None, softcap: float | None, sinks: torch.Tensor | None) -> None:
        """Overwrite the pictures' rows of `out` [T, Hq, D] (the backend's causal attention of q [T, Hq, D])."""
        k_flat = k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])
        v_flat = v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])
        for picture, (slots, mask) in zip(self.pictures, self._read(window)):
            rows = slice(picture.row, picture.row + picture.end - picture.first)
            qp = q[rows].transpose(0, 1)[None]
            kp = read_slots(k_flat, slots, q.dtype).transpose(0, 1)[None]
            vp = read_slots(v_flat, slots, q.dtype).transpose(0, 1)[None]
            out[rows] = masked_attention(qp, kp, vp, mask, scale, softcap, sinks)[0].transpose(0, 1)

    def _read(self, window: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if window not in self._reads:
            self._reads[window] = [self._keys(picture, window) for picture in self.pictures]
        return self._reads[window]

    def _keys(self, picture: PictureRows, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        first_key = 0 if window is None else max(0, picture.first - window + 1)
        keys = torch.arange(first_key, picture.end)[None, :]
        queries = torch.arange(picture.first, picture.end)[:, None]
        mask = (keys <= queries) | (keys >= picture.start)
        if window is not None:
            mask &= keys > queries - window
        table = torch.tensor(picture.block_table, dtype=torch.long)
        positions = keys[0]
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        return to_device(slots, self.device), to_device(mask, self.device)


def pictures_in_chunk(pictures: list[tuple[int, int]], start: int, end: int, row: int,
                      block_table: list[int]) -> list[PictureRows]:
    """The pictures (each positions [start, end) of its sequence) that a prefill chunk of positions [start, end),
    the step's rows from `row` on, holds queries of."""
    found = []
    for picture_start, picture_end in pictures:
        if picture_start < end and start < picture_end:
            if picture_end > end:
                raise RuntimeError("a prefill chunk ends inside a picture whose tokens attend both ways")
            first = max(start, picture_start)
            found.append(PictureRows(row + first - start, first, picture_start, picture_end, block_table))
    return found
