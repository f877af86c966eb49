"""Paged attention (the torch reference and the C++ CPU kernel) equals dense causal attention, for
every kind of row in a mixed batch."""

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import TorchBackend
from kernels.cpu.attention import CpuBackend


@pytest.mark.parametrize(("backend", "HQ", "HKV", "D", "BLOCK"), [
    (TorchBackend(), 4, 2, 8, 4),
    (CpuBackend(), 4, 2, 16, 4),  # blocks shorter than the kernel's 16-token steps
    (CpuBackend(), 14, 2, 64, 16),  # Qwen2.5-0.5B's seven query heads per KV head
    (CpuBackend(), 8, 8, 128, 32),  # no grouping; blocks longer than 16 tokens
    (CpuBackend(), 10, 2, 32, 17),  # blocks that 16-token steps straddle
], ids=lambda p: getattr(p, "name", None))
def test_mixed_batch_matches_dense_attention(backend, HQ, HKV, D, BLOCK):
    torch.manual_seed(0)
    num_blocks = 64
    k_cache = torch.zeros(num_blocks, BLOCK, HKV, D)
    v_cache = torch.zeros(num_blocks, BLOCK, HKV, D)
    shared = [1, 2, 3]  # three blocks of a common prefix
    # (block table, context length, new tokens this step)
    seqs = [
        (shared + [10, 11], 4 * BLOCK + 2, 1),  # decodes sharing the prefix
        (shared + [12], 3 * BLOCK + 1, 1),
        (shared + [13, 14, 15], 5 * BLOCK + 1, 1),
        ([20, 21], BLOCK + 2, 1),  # a decode alone
        ([30, 31, 32], 2 * BLOCK + 3, 2 * BLOCK + 3),  # a fresh prefill
        (shared + [40, 41], 4 * BLOCK + 3, BLOCK + 3),  # a prefill chunk after the cached prefix
    ]
    contexts = [torch.randn(ctx, 2, HKV, D) for _, ctx, _ in seqs]  # full K/V per sequence
    # the cache already holds every token before this step's chunk (the shared prefix written once)
    for (table, ctx, new), kv in zip(seqs, contexts):
        if table[:3] == shared:
            kv[: 3 * BLOCK] = contexts[0][: 3 * BLOCK]
        for pos in range(ctx - new):
            k_cache[table[pos // BLOCK], pos % BLOCK] = kv[pos, 0]
            v_cache[table[pos // BLOCK], pos % BLOCK] = kv[pos, 1]
    meta = backend.build_metadata([n for *_, n in seqs], [c for _, c, _ in seqs], [t for t, *_ in seqs],
                                  BLOCK, num_decodes=4, device=torch.device("cpu"))
    assert meta.backend is backend and meta.num_decodes == 4
    if backend.name == "torch":
        assert [g.prefix_slots.numel() for g in meta.decode_groups] == [3 * BLOCK, 0]
    new_k = torch.cat([kv[ctx - n :, 0] for (_, ctx, n), kv in zip(seqs, contexts)])
    new_v = torch.cat([kv[ctx - n :, 1] for (_, ctx, n), kv in zip(seqs, contexts)])
    backend.store_kv(new_k, new_v, k_cache, v_cache, meta)
    q = torch.randn(new_k.shape[0], HQ, D)
    out = backend.attend(q, k_cache, v_cache, meta, scale=D**-0.5)

    start = 0
    for (_, ctx, n), kv in zip(seqs, contexts):
        qs = q[start : start + n].transpose(0, 1)
        k = kv[:, 0].transpose(0, 1).repeat_interleave(HQ // HKV, dim=0)
        v = kv[:, 1].transpose(0, 1).repeat_interleave(HQ // HKV, dim=0)
        allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
        expected = F.scaled_dot_product_attention(qs, k, v, attn_mask=allowed, scale=D**-0.5).transpose(0, 1)
        torch.testing.assert_close(out[start : start + n], expected, atol=1e-5, rtol=1e-5)
        start += n

