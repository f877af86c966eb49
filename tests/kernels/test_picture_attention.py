"""A picture's rows attended both ways (`kernels.attention.pictures`, Gemma 3) equal dense attention under
transformers' mask (causal or within the picture; under a window, keys less than `window` positions back), for a
chunk holding the whole picture and for one starting inside it (a cached prefix ended there), beside a decode row
and another prefill that stay as the backend computed them."""

import pytest
import torch

from kernels.attention.pictures import PictureAttention, pictures_in_chunk
from kernels.attention.torch_backend import TorchBackend

HQ, HKV, D, BLOCK = 4, 2, 8, 4


def dense_with_picture(q, k, v, first, scale, picture, window):
    """Queries at positions first.. over the whole context, a picture [start, end) seeing itself both ways."""
    heads = q.shape[1]
    k, v = k.repeat_interleave(heads // HKV, dim=1), v.repeat_interleave(heads // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    keys, queries = torch.arange(k.shape[0])[None, :], torch.arange(first, first + q.shape[0])[:, None]
    start, end = picture
    both_ways = (keys >= start) & (keys < end) & (queries >= start) & (queries < end)
    allowed = ((keys <= queries) | both_ways) & (keys > queries - (window or k.shape[0] + 1))
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("cached", [0, 9])  # the prefill's first position: before the picture [6, 14), inside it
def test_picture_rows_equal_dense_attention(window, cached):
    torch.manual_seed(0)
    k_cache, v_cache = torch.zeros(32, BLOCK, HKV, D), torch.zeros(32, BLOCK, HKV, D)
    picture, ctx = (6, 14), 17
    seqs = [([1, 2], 6, 1), ([3, 4, 5, 6, 7], ctx, ctx - cached), ([8, 9], 5, 5)]  # (table, context, new)
    contexts = [torch.randn(n, 2, HKV, D) for _, n, _ in seqs]
    for (table, n, _), kv in zip(seqs, contexts):
        for position in range(n):
            k_cache[table[position // BLOCK], position % BLOCK] = kv[position, 0]
            v_cache[table[position // BLOCK], position % BLOCK] = kv[position, 1]
    q = torch.randn(sum(new for _, _, new in seqs), HQ, D)
    backend = TorchBackend()
    meta = backend.build_metadata([s[2] for s in seqs], [s[1] for s in seqs], [s[0] for s in seqs], BLOCK, 1,
                                  torch.device("cpu"))
    out = backend.attend(q, k_cache, v_cache, meta, D**-0.5, window)
    causal = out.clone()
    rows = pictures_in_chunk([picture], cached, ctx, 1, seqs[1][0])
    assert [(r.row, r.first) for r in rows] == [(1 + max(0, picture[0] - cached), max(cached, picture[0]))]
    PictureAttention(rows, BLOCK, torch.device("cpu")).attend(out, q, k_cache, v_cache, D**-0.5, window, None, None)

    kv = contexts[1]
    expected = dense_with_picture(q[1 : 1 + ctx - cached], kv[:, 0], kv[:, 1], cached, D**-0.5, picture, window)
    torch.testing.assert_close(out[1 : 1 + ctx - cached], expected)  # the text after the picture: causal
    assert not torch.allclose(out[1 : 1 + ctx - cached], causal[1 : 1 + ctx - cached])  # the picture's rows changed
    assert torch.equal(out[0], causal[0]) and torch.equal(out[1 + ctx - cached :], causal[1 + ctx - cached :])


def test_a_chunk_ending_inside_a_picture_is_refused():
    with pytest.raises(RuntimeError, match="ends inside a picture"):
        pictures_in_chunk([(6, 14)], 0, 10, 0, [1, 2, 3, 4])
