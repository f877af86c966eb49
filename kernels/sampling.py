"""Sampling each row's token from processed logits: temperature, top-k, top-p and min-p, then one draw.

Per row: temperature 0 is the argmax. Otherwise the logits are divided by the temperature; top-k keeps the
tokens at least as likely as the k-th most likely (ties with it are kept), top-p the fewest most likely of those
whose mass, renormalised over them, reaches p (ties with the last one kept), min-p the tokens at least min_p
times as likely as the most likely; and the token is drawn by inverse transform sampling: the first whose
cumulative kept probability exceeds the row's uniform times their total. So one uniform per row makes the draw,
a row's token depends only on its logits, options and uniform, and a token of probability 0 is never chosen.
`top_ks` 0, `top_ps` 1 and `min_ps` 0 cut nothing.

The kernels (C++ on CPU, Triton on a GPU) read the logits a few times instead of sorting or writing them whole
several times over; the torch version below is their oracle and the fallback.
"""

import torch

from kernels.cpu import sampling as cpu_sampling
from kernels.reduce import argmax


def sample(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor,
           min_ps: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab]; the rest [rows], on the logits' device: temperatures, top_ps and min_ps float32,
    top_ks int64, uniforms float64 in [0, 1). Returns each row's token, int64."""
    if logits.is_cuda:
        from kernels.triton.sampling import sample as triton_sample

        return triton_sample(logits, temperatures, top_ks, top_ps, min_ps, uniforms)
    logits = logits.float()
    if cpu_sampling.applies(logits):
        return cpu_sampling.sample(logits, temperatures, top_ks, top_ps, min_ps, uniforms)
    return sample_reference(logits, temperatures, top_ks, top_ps, min_ps, uniforms)


def sample_reference(logits, temperatures, top_ks, top_ps, min_ps, uniforms) -> torch.Tensor:
    """The torch version of `sample`, by a sort of each row."""
    logits = logits.float()
    greedy = temperatures <= 0
    scaled = logits / torch.where(greedy, 1.0, temperatures)[:, None]
    kept = scaled.masked_fill(scaled < _top_k_top_p_cut(scaled, top_ks, top_ps)[:, None], float("-inf"))
    probs = torch.softmax(kept, dim=-1)
    probs = probs.masked_fill(probs < min_ps[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    return torch.where(greedy, argmax(logits), _inverse_cdf(probs, uniforms))


def _top_k_top_p_cut(scaled: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Each row's smallest kept (temperature-scaled) logit under top-k then top-p."""
    vocab = scaled.shape[1]
    values = scaled.sort(dim=-1, descending=True).values
    ks = torch.where((top_ks > 0) & (top_ks < vocab), top_ks, vocab)
    k_cut = values.gather(1, (ks - 1)[:, None])
    probs = torch.softmax(values.masked_fill(values < k_cut, float("-inf")), dim=-1)
    reached = probs.cumsum(dim=-1) >= top_ps[:, None]
    p_cut = values.gather(1, reached.float().argmax(dim=-1, keepdim=True))
    use_p = (top_ps < 1)[:, None] & reached.any(dim=-1, keepdim=True)
    return torch.where(use_p, torch.maximum(k_cut, p_cut), k_cut)[:, 0]


_CDF_BLOCK = 1024


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Each row's token by inverse transform sampling, in two levels, so that no probability is lost to rounding
    in a long float32 sum and no pass over the vocabulary runs in float64: the block of `_CDF_BLOCK` tokens, by
    the cumulative block sums, then the token within it. A token (or block) of probability 0 is never chosen: its
    cumulative probability equals the one before it."""
    probs = probs.contiguous()
    rows, vocab = probs.shape
    block = min(vocab, _CDF_BLOCK)
    full = vocab // block
    sums = probs.as_strided((rows, full, block), (vocab, block, 1)).sum(dim=-1)
    if vocab % block:
        sums = torch.cat([sums, probs[:, full * block :].sum(dim=-1, keepdim=True)], dim=1)
    block_cdf = sums.double().cumsum(dim=-1)
    targets = uniforms.double()[:, None] * block_cdf[:, -1:]
    chosen = torch.minimum(torch.searchsorted(block_cdf, targets, right=True), _last_increase(block_cdf))
    before = torch.where(chosen > 0, block_cdf.gather(1, (chosen - 1).clamp(min=0)), 0.0)
    columns = chosen * block + torch.arange(block, device=probs.device)
    inside = probs.gather(1, columns.clamp(max=vocab - 1)).masked_fill(columns >= vocab, 0.0).double().cumsum(dim=-1)
    offset = torch.minimum(torch.searchsorted(inside, targets - before, right=True), _last_increase(inside))
    return (chosen * block + offset)[:, 0]


def _last_increase(cdf: torch.Tensor) -> torch.Tensor:
    """[rows, 1]: the last position of each cumulative row where it still rises (its last nonzero term)."""
    return (cdf < cdf[:, -1:]).sum(dim=-1, keepdim=True)
