"""Per-step attention metadata over the paged KV cache, built once and shared by every layer.

The KV cache of one layer is a pair of tensors shaped
`[num_blocks, block_size, num_kv_heads, head_dim]`; token `i` of a sequence
lives at slot `block_table[i // block_size] * block_size + i % block_size`.

A step's batch is flattened: all scheduled tokens of all sequences are
concatenated, decode sequences (one new token each) first, then prefill chunks
(several new tokens, possibly after a cached or earlier-computed prefix).
Decode sequences that share leading blocks (a common system prompt served
from the prefix cache) are grouped, so attention reads the shared prefix once
per group instead of once per sequence.
"""

from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass
class DecodeGroup:
    """Decode rows that share their first `len(prefix_slots)` context tokens."""

    rows: torch.Tensor  # indices of the group's rows among the decode rows
    prefix_slots: torch.Tensor  # [P] slots of the shared prefix (P may be 0)
    suffix_slots: torch.Tensor  # [rows, S] each row's slots after the prefix, padded
    suffix_mask: torch.Tensor  # [rows, 1, 1, S] True for real (unpadded) positions


@dataclass
class PrefillSpan:
    """One prefill chunk: its rows in the flattened batch and the slots it attends to."""

    start: int
    end: int
    slots: torch.Tensor  # [context_len] cache slots of the whole context, chunk included
    mask: torch.Tensor | None  # [chunk_len, context_len] True where attention is allowed; None: causal


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V is stored
    num_decodes: int
    decode_groups: list[DecodeGroup]  # for the torch backend
    prefills: list[PrefillSpan]  # for the torch backend
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, for the kernel backends
    row_seq: torch.Tensor | None  # [num_tokens] int32: each new token's sequence, for the cpu backend
    row_len: torch.Tensor | None  # [num_tokens] int32: how many context tokens each new token attends to
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    max_query_len: int
    max_context_len: int
    backend: str = "torch"

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        num_decodes: int,
        device: torch.device,
        backend: str = "torch",
    ) -> "AttentionMetadata":
        """`context_lens[i]` counts sequence i's tokens up to and including this step's chunk."""
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long)
        lens = torch.tensor(query_lens)
        row = torch.repeat_interleave(torch.arange(len(query_lens)), lens)  # each new token's sequence
        first = torch.tensor(context_lens) - lens  # each sequence's first new position
        new_positions = first[row] + torch.arange(len(row)) - (lens.cumsum(0) - lens)[row]
        slot_mapping = (tables[row, new_positions // block_size] * block_size + new_positions % block_size).to(device)
        groups, prefills, row_seq, row_len = [], [], None, None
        if backend == "cpu":
            row_seq, row_len = row.to(torch.int32), (new_positions + 1).to(torch.int32)
        if backend == "torch":  # the kernel backends read the block tables directly
            positions = torch.arange(max(context_lens))
            # every sequence's slots for positions [0, max_ctx); rows are valid up to their context length
            all_slots = tables[:, positions // block_size] * block_size + positions % block_size
            groups = [
                _decode_group(rows, prefix_blocks * block_size, all_slots, context_lens, device)
                for rows, prefix_blocks in _shared_prefixes(block_tables[:num_decodes], context_lens, block_size)
            ]
            prefills = _prefill_spans(query_lens, context_lens, num_decodes, all_slots, device)
        starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return cls(slot_mapping, num_decodes, groups, prefills, tables.to(device=device, dtype=torch.int32),
                   row_seq, row_len, starts.to(device), torch.tensor(context_lens, dtype=torch.int32, device=device),
                   max(query_lens), max(context_lens), backend)


def _prefill_spans(query_lens, context_lens, num_decodes: int, all_slots: torch.Tensor,
                   device: torch.device) -> list[PrefillSpan]:
    positions = torch.arange(all_slots.shape[1])
    spans, start = [], num_decodes
    for i in range(num_decodes, len(query_lens)):
        q, ctx = query_lens[i], context_lens[i]
        mask = None
        if ctx != q:  # a cached prefix precedes the chunk: causal with an offset
            mask = (positions[:ctx][None, :] <= positions[ctx - q : ctx, None]).to(device)
        spans.append(PrefillSpan(start, start + q, all_slots[i, :ctx].to(device), mask))
        start += q
    return spans


def _shared_prefixes(tables: list[list[int]], context_lens: list[int], block_size: int):
    """Partition decode rows into (rows, number of leading blocks they all share).

    Rows are grouped by their first block; a group's prefix stops before any
    row's last token, so each row keeps at least its current token apart.
    Rows that share nothing form one group with an empty prefix.
    """
    by_first = defaultdict(list)
    for row, table in enumerate(tables):
        by_first[table[0]].append(row)
    alone = []
    for rows in by_first.values():
        if len(rows) == 1:
            alone += rows
            continue
        limit = min((context_lens[r] - 1) // block_size for r in rows)
        first = tables[rows[0]]
        shared = 0
        while shared < limit and all(tables[r][shared] == first[shared] for r in rows):
            shared += 1
        yield rows, shared
    if alone:
        yield alone, 0


def _decode_group(rows: list[int], prefix: int, all_slots: torch.Tensor, context_lens: list[int],
                  device: torch.device) -> DecodeGroup:
    lens = torch.tensor([context_lens[r] for r in rows])
    longest = int(lens.max())
    index = torch.tensor(rows)
    suffix_positions = torch.arange(prefix, longest)
    return DecodeGroup(
        rows=index.to(device),
        prefix_slots=all_slots[rows[0], :prefix].to(device),
        suffix_slots=all_slots[index][:, prefix:longest].to(device),
        suffix_mask=(suffix_positions[None, :] < lens[:, None])[:, None, None, :].to(device),
    )
