"""Chunked local attention (Llama 4): a layer that attends within fixed chunks of `chunk` positions, a query at
position p seeing the positions from the start of its chunk, p - p % chunk, up to itself.

No backend needs to know: each sequence's queries are cut where a chunk starts, and each piece becomes a sequence
of its own whose context begins at its chunk's first position (its block table starts at that chunk's first
block, so `chunk` must be a multiple of the block size). The pieces keep the step's token order, so their KV slots
are the step's own; decodes stay one-token pieces, first.
"""

from dataclasses import dataclass

from kernels import AttentionMetadata


@dataclass
class ChunkedAttentionMetadata:
    """A step's metadata for a model with chunked layers: `full` for the others."""

    full: AttentionMetadata
    chunked: AttentionMetadata


def chunked_view(query_lens: list[int], context_lens: list[int], block_tables: list[list[int]], chunk: int,
                 block_size: int) -> tuple[list[int], list[int], list[list[int]]]:
    """The step's sequences cut at chunk starts: each piece's query length, context length (from its chunk's
    start) and block table (from its chunk's first block)."""
    pieces: tuple[list[int], list[int], list[list[int]]] = ([], [], [])
    for n, total, table in zip(query_lens, context_lens, block_tables):
        position = total - n
        while position < total:
            start = position - position % chunk
            end = min(total, start + chunk)
            pieces[0].append(end - position)
            pieces[1].append(end - start)
            pieces[2].append(table[start // block_size : -(-end // block_size)])
            position = end
    return pieces
