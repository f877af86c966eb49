"""The interface every attention backend implements over the paged KV cache.

The KV cache of one layer is a pair of tensors shaped
`[num_blocks, block_size, num_kv_heads, head_dim]`; token `i` of a sequence
lives at slot `block_table[i // block_size] * block_size + i % block_size`.

A step's batch is flattened: all scheduled tokens of all sequences are
concatenated, decode sequences (one new token each) first, then prefill chunks
(several new tokens, possibly after a cached or earlier-computed prefix).
Once per step the backend turns that batch into its own metadata, which every
layer then hands back to the same backend to store K/V and attend.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


@dataclass
class AttentionMetadata:
    """What every backend's metadata holds; each backend's subclass adds what its kernels read."""

    backend: "AttentionBackend"  # the backend that built it, the only one that can read it
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V is stored (negative: nowhere)
    num_decodes: int  # the batch's first rows are this many decodes, one token each
    # a step of a model whose pictures' tokens attend both ways, with such pictures: their rows, attended again
    # after the backend's causal attention (a `kernels.attention.pictures.PictureAttention`, which imports this)
    pictures: Any = field(default=None, kw_only=True)


class AttentionBackend(ABC):
    name: str
    supports_cuda_graphs = False  # whether a decode step's launches depend only on shapes, so it can be captured

    @abstractmethod
    def build_metadata(self, query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
                       block_size: int, num_decodes: int, device: torch.device) -> AttentionMetadata:
        """The step's metadata; `context_lens[i]` counts sequence i's tokens up to and including this step's
        chunk of `query_lens[i]` new tokens."""

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """Write the new tokens' K/V [T, Hkv, D] into the cache at `meta.slot_mapping`."""

    @abstractmethod
    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, window: int | None = None, softcap: float | None = None,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of the new queries [T, Hq, D] over each sequence's cached context; the new
        tokens' K/V must already be stored.

        A layer may narrow or reshape it: `window` keeps the last `window` positions (the query's own
        included: position p sees p - window + 1 .. p), `softcap` caps each scaled score s at
        softcap * tanh(s / softcap), and `sinks` [Hq] adds to each head's softmax a virtual key of that
        logit whose value is zero (gpt-oss's attention sinks)."""


class NewTokens(NamedTuple):
    """Where the step's new tokens sit: the padded block tables and, for each new token, its sequence,
    its position in that sequence and its cache slot (all int64, on the CPU)."""

    tables: torch.Tensor  # [num_seqs, max_blocks]
    seqs: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    slots: torch.Tensor  # [num_tokens]


def new_tokens(query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
               block_size: int) -> NewTokens:
    width = max(len(t) for t in block_tables)
    tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long)
    lens = torch.tensor(query_lens)
    seqs = torch.repeat_interleave(torch.arange(len(query_lens)), lens)
    first = torch.tensor(context_lens) - lens  # each sequence's first new position
    positions = first[seqs] + torch.arange(len(seqs)) - (lens.cumsum(0) - lens)[seqs]
    slots = tables[seqs, positions // block_size] * block_size + positions % block_size
    return NewTokens(tables, seqs, positions, slots)
