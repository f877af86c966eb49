"""Sampling on a GPU (kernels/sampling.py gives the contract): one program per row, reading its logits in tiles.

A first pass finds the row's largest logit m and its argmax (a greedy row ends there), a second the total of
e = exp((x - m) / T). Top-k and top-p cuts are found by bisection over the logits' float32 values in their order
as integers (32 passes at most, each counting or weighing the tokens at or above a candidate cut): the largest
cut with at least k tokens above it is the k-th largest logit, the largest with mass p of the top-k's at or above
it is the smallest logit the nucleus keeps. Min-p keeps e >= min_p. The draw then walks the kept probabilities
tile by tile to the one where u times their total falls.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _ordered(x):
    """float32 -> int32 with the same order."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _unordered(key):
    """The inverse of `_ordered`."""
    return tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _above(row, vocab, cut, m, scale, BLOCK: tl.constexpr):
    """How many tokens have a logit >= cut, and their total e."""
    offs = tl.arange(0, BLOCK)
    count = tl.zeros((), tl.int32)
    mass = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK):
        x = tl.load(row + start + offs, mask=start + offs < vocab, other=float("-inf")).to(tl.float32)
        kept = x >= cut
        count += tl.sum(kept.to(tl.int32))
        mass += tl.sum(tl.where(kept, tl.exp((x - m) * scale), 0.0))
    return count, mass


@triton.jit
def _largest_cut(row, vocab, low_cut, m, scale, goal, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """The largest logit value (at least `low_cut`) with at least `goal` tokens, or `goal` mass, at or above it: a
    bisection over the values' order as integers."""
    low = _ordered(low_cut).to(tl.int64)
    high = _ordered(m).to(tl.int64)
    while low < high:
        middle = low + (high - low + 1) // 2
        count, mass = _above(row, vocab, _unordered(middle.to(tl.int32)), m, scale, BLOCK)
        reached = mass >= goal if BY_MASS else count.to(tl.float32) >= goal
        if reached:
            low = middle
        else:
            high = middle - 1
    return _unordered(low.to(tl.int32))


@triton.jit
def _sample_kernel(logits, stride, out, temperatures, top_ks, top_ps, min_ps, uniforms, vocab,
                   BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = logits + r.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    best = tl.zeros((), tl.int32)
    for start in range(0, vocab, BLOCK):
        x = tl.load(row + start + offs, mask=start + offs < vocab, other=float("-inf")).to(tl.float32)
        tile_max = tl.max(x)
        best = tl.where(tile_max > m, start + tl.min(tl.where(x == tile_max, offs, BLOCK)), best)
        m = tl.maximum(m, tile_max)
    token = best.to(tl.int64)
    temperature = tl.load(temperatures + r)
    if (temperature > 0) & (m > float("-inf")):
        scale = 1.0 / temperature
        top_k = tl.load(top_ks + r)
        top_p = tl.load(top_ps + r)
        min_p = tl.load(min_ps + r)
        cut = tl.full((), float("-inf"), tl.float32)
        if (top_k > 0) & (top_k < vocab):  # the largest cut with k tokens at or above it
            cut = _largest_cut(row, vocab, cut, m, scale, top_k.to(tl.float32), False, BLOCK)
        if top_p < 1.0:  # the largest cut with mass p of the kept at or above it
            _, kept = _above(row, vocab, cut, m, scale, BLOCK)
            cut = _largest_cut(row, vocab, cut, m, scale, top_p * kept, True, BLOCK)
        total = tl.zeros((), tl.float32)
        last = tl.zeros((), tl.int32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(row + start + offs, mask=start + offs < vocab, other=float("-inf")).to(tl.float32)
            e = tl.exp((x - m) * scale)
            kept = (x >= cut) & (e >= min_p) & (e > 0)
            total += tl.sum(tl.where(kept, e, 0.0))
            last = tl.maximum(last, tl.max(tl.where(kept, start + offs, -1)))
        target = tl.load(uniforms + r).to(tl.float32) * total
        mass = tl.zeros((), tl.float32)
        chosen = last
        found = tl.zeros((), tl.int32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(row + start + offs, mask=start + offs < vocab, other=float("-inf")).to(tl.float32)
            e = tl.exp((x - m) * scale)
            p = tl.where((x >= cut) & (e >= min_p), e, 0.0)
            crossing = tl.min(tl.where((mass + tl.cumsum(p, 0) > target) & (p > 0), offs, BLOCK))
            here = (found == 0) & (crossing < BLOCK)
            chosen = tl.where(here, start + crossing, chosen)
            found = tl.where(here, 1, found)
            mass += tl.sum(p)
        token = chosen.to(tl.int64)
    tl.store(out + r, token)


def sample(logits, temperatures, top_ks, top_ps, min_ps, uniforms) -> torch.Tensor:
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    _sample_kernel[(rows,)](logits, logits.stride(0), out, temperatures.float().contiguous(),
                            top_ks.long().contiguous(), top_ps.float().contiguous(), min_ps.float().contiguous(),
                            uniforms.double().contiguous(), vocab, BLOCK=_BLOCK)
    return out
