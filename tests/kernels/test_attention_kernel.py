"""Paged attention (the torch reference and the C++ CPU kernel) equals dense causal attention, for
every kind of row in a mixed batch, with and without a sliding window, soft-capped scores and sinks."""

import pytest
import torch

from kernels.attention.torch_backend import TorchBackend
from kernels.cpu.attention import CpuBackend

BACKENDS = [
    (TorchBackend(), 4, 2, 8, 4),
    (CpuBackend(), 4, 2, 16, 4),  # blocks shorter than the kernel's 16-token steps
    (CpuBackend(), 14, 2, 64, 16),  # Qwen2.5-0.5B's seven query heads per KV head
    (CpuBackend(), 8, 8, 128, 32),  # no grouping; blocks longer than 16 tokens
    (CpuBackend(), 10, 2, 32, 17),  # blocks that 16-token steps straddle
    (CpuBackend(), 6, 3, 80, 16),  # columns in 8 + 2 vectors of 8 lanes (AVX) or 5 of 16 (AVX-512)
    (CpuBackend(), 16, 1, 576, 16),  # latent attention: every head over one KV head, DeepSeek's latent + rotary part
]
# (window, softcap, sinks): a window shorter than most contexts, one inside a block, Gemma 2's cap, gpt-oss's sinks
VARIANTS = [(None, None, False), (7, None, False), (20, None, False), (None, 5.0, False), (None, None, True),
            (13, 5.0, True)]


def dense_attention(q, k, v, first: int, scale: float, window=None, softcap=None, sinks=None) -> torch.Tensor:
    """Queries q [n, Hq, D] at positions first.. over a whole context k, v [ctx, Hkv, D], written out."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    keys, queries = torch.arange(k.shape[0])[None, :], torch.arange(first, first + q.shape[0])[:, None]
    allowed = (keys <= queries) & (keys > queries - (window or k.shape[0] + 1))
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks[:, None, None].expand(-1, q.shape[0], 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., : k.shape[0]]
    return torch.einsum("hqk,khd->qhd", probs, v)


def mixed_batch(HQ, HKV, D, BLOCK):
    """A cache holding every sequence's context before this step, the step's layout and the full K/V."""
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
    return k_cache, v_cache, seqs, contexts


@pytest.mark.parametrize(("window", "softcap", "sinks"), VARIANTS)
@pytest.mark.parametrize(("backend", "HQ", "HKV", "D", "BLOCK"), BACKENDS, ids=lambda p: getattr(p, "name", None))
def test_mixed_batch_matches_dense_attention(backend, HQ, HKV, D, BLOCK, window, softcap, sinks):
    k_cache, v_cache, seqs, contexts = mixed_batch(HQ, HKV, D, BLOCK)
    meta = backend.build_metadata([n for *_, n in seqs], [c for _, c, _ in seqs], [t for t, *_ in seqs],
                                  BLOCK, num_decodes=4, device=torch.device("cpu"))
    assert meta.backend is backend and meta.num_decodes == 4
    if backend.name == "torch":
        assert [g.prefix_slots.numel() for g in meta.view(None).decode_groups] == [3 * BLOCK, 0]
    new_k = torch.cat([kv[ctx - n :, 0] for (_, ctx, n), kv in zip(seqs, contexts)])
    new_v = torch.cat([kv[ctx - n :, 1] for (_, ctx, n), kv in zip(seqs, contexts)])
    backend.store_kv(new_k, new_v, k_cache, v_cache, meta)
    q = torch.randn(new_k.shape[0], HQ, D)
    sink_logits = torch.randn(HQ) * 2 if sinks else None
    out = backend.attend(q, k_cache, v_cache, meta, D**-0.5, window=window, softcap=softcap, sinks=sink_logits)

    start = 0
    for (_, ctx, n), kv in zip(seqs, contexts):
        expected = dense_attention(q[start : start + n], kv[:, 0], kv[:, 1], ctx - n, D**-0.5, window, softcap,
                                   sink_logits)
        torch.testing.assert_close(out[start : start + n], expected, atol=1e-5, rtol=1e-5)
        start += n


def test_a_window_reads_no_block_before_it():
    """Blocks wholly before every row's window may be freed: the kernels must not read them (here: NaN)."""
    window, block = 5, 4
    for backend in (TorchBackend(), CpuBackend()):
        k_cache, v_cache, seqs, _ = mixed_batch(4, 2, 16, block)
        meta = backend.build_metadata([n for *_, n in seqs], [c for _, c, _ in seqs], [t for t, *_ in seqs],
                                      block, num_decodes=4, device=torch.device("cpu"))
        seen = {t[p // block] for t, ctx, n in seqs for p in range(max(0, ctx - n - window + 1), ctx)}
        unseen = list({b for t, *_ in seqs for b in t} - seen)
        assert unseen
        k_cache[unseen] = v_cache[unseen] = float("nan")
        q = torch.randn(sum(n for *_, n in seqs), 4, 16)
        out = backend.attend(q, k_cache, v_cache, meta, 0.25, window=window)
        assert not out.isnan().any(), backend.name
