"""CUDA graphs of the decode step: the model's forward and LM head captured once per batch-size bucket.

A decode-only step launches hundreds of small kernels (24 layers of norms,
projections, rotary, KV store, attention); replaying a captured graph costs
one launch. Each graph reads its inputs from persistent buffers, which every
step fills in place; a batch is padded up to the next bucket with rows that
store no K/V (slot -1) and attend to one token, and their logits are dropped.
"""

import numpy as np
import torch

from kernels.triton.attention import TritonBackend, TritonMetadata


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to `max_batch` (which is always a bucket)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, max_batch: int, max_model_len: int, block_size: int,
                 attention_backend: TritonBackend, device: torch.device):
        self.model = model
        self.buckets = batch_buckets(max_batch)
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        self.backend = attention_backend
        self.device = device
        n = self.buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture()

    def _metadata(self, batch: int) -> TritonMetadata:
        return self.backend.metadata(self.slot_mapping[:batch], batch, self.block_tables[:batch],
                                     self.query_start_loc[: batch + 1], self.context_lens[:batch], 1,
                                     self.max_model_len)

    def _forward(self, batch: int) -> torch.Tensor:
        hidden = self.model(self.input_ids[:batch], self.positions[:batch], self._metadata(batch))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for batch in reversed(self.buckets):  # largest first, so smaller graphs reuse its memory
            self._forward(batch)  # compiles the kernels outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):  # other threads may use CUDA
                self.logits[batch] = self._forward(batch)
            pool = graph.pool()
            self.graphs[batch] = graph
        torch.cuda.synchronize(self.device)

    def fits(self, num_seqs: int, num_decodes: int, max_blocks: int) -> bool:
        return num_seqs == num_decodes and 0 < num_seqs <= self.buckets[-1] and max_blocks <= self.max_blocks

    def run(self, input_ids: torch.Tensor, positions: list[int], context_lens: list[int],
            block_tables: list[list[int]], block_size: int) -> torch.Tensor:
        """Logits [len(input_ids), vocab] of one decode step (`input_ids` on the device); valid until the next
        `run`. Its copies come from pinned memory, so the host does not wait for the device's queued work."""
        n = len(input_ids)
        batch = next(b for b in self.buckets if b >= n)
        tables = np.zeros((batch, self.max_blocks), dtype=np.int32)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        pos = np.asarray(positions, dtype=np.int64)
        slots = np.full(batch, -1, dtype=np.int64)
        slots[:n] = tables[np.arange(n), pos // block_size].astype(np.int64) * block_size + pos % block_size
        lens = np.ones(batch, dtype=np.int32)
        lens[:n] = context_lens
        self.input_ids[:n].copy_(input_ids)
        for buffer, values in ((self.positions[:n], pos), (self.slot_mapping[:batch], slots),
                               (self.block_tables[:batch], tables), (self.context_lens[:batch], lens)):
            buffer.copy_(torch.from_numpy(values).pin_memory(), non_blocking=True)
        self.graphs[batch].replay()
        return self.logits[batch][:n]
