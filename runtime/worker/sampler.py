"""One batched sampling pass over every sequence that needs a token this step.

Order: penalties, logit bias, min-tokens masking, the structured-output
grammar bitmask, greedy argmax, then
temperature, top-k, top-p, min-p and sampling. Top-k and top-p cut each row at a
threshold found among its most likely tokens on CPU (a sort of the whole
vocabulary only for a nucleus wider than those; on a GPU, a sort); sampling is inverse transform sampling,
one uniform per row, an exact draw from p; seeded sequences draw their uniform
from their own generator, so their tokens do not depend on the rest of the
batch. Logprobs are taken from the raw model
distribution (before any processing), as OpenAI reports them.
"""

import torch

from kernels import argmax, tensor_on
from runtime.core.sequence import Sequence
from runtime.outputs import TokenLogprob
from runtime.text.grammar import allocate_bitmask, apply_bitmask


class Sampler:
    def __init__(self, eos_token_ids: set[int], device: torch.device):
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._bitmask = None  # grammar bitmask rows, reused across steps

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """The batch's tokens and logprobs, on the host."""
        tokens, raw_logprobs = self.sample(logits, seqs)
        token_list = tokens.tolist()
        return token_list, self.logprobs(token_list, raw_logprobs, seqs)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's tokens, left on the device, and the raw log-probabilities that `logprobs` reads (None
        when no row reports logprobs). Queues the work without waiting for the device, unless a row has
        penalties, a logit bias, an unmet min_tokens or a grammar (their masks are built on the host)."""
        if all(s.params.greedy and s.params.logprobs is None and not self._processes(s) for s in seqs):
            return argmax(logits), None  # argmax is exact in the model's dtype
        logits = logits.float()
        raw_logprobs = None
        if any(s.params.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if any(self._processes(s) for s in seqs):
            logits = self._process(logits.clone(), seqs)
        return self._choose(logits, seqs), raw_logprobs

    def logprobs(self, tokens: list[int], raw_logprobs: torch.Tensor | None,
                 seqs: list[Sequence]) -> list[TokenLogprob | None]:
        """Each row's logprob entry (None where the request asked for none). `raw_logprobs`: `sample`'s, or a
        list of rows (None where a row failed)."""
        if raw_logprobs is None:
            return [None] * len(seqs)
        return [None if s.params.logprobs is None or raw_logprobs[i] is None
                else token_logprob(raw_logprobs[i], tokens[i], s.params.logprobs) for i, s in enumerate(seqs)]

    def _processes(self, s: Sequence) -> bool:
        """Whether `_process` changes this sequence's logits."""
        p = s.params
        return p.uses_penalties or bool(p.logit_bias) or _below_min_tokens(s) or s.matcher is not None

    def _process(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        if any(s.params.uses_penalties for s in seqs):
            self._apply_penalties(logits, seqs)
        for i, s in enumerate(seqs):
            if s.params.logit_bias:
                ids = torch.tensor(list(s.params.logit_bias), device=logits.device)
                bias = torch.tensor(list(s.params.logit_bias.values()), device=logits.device)
                logits[i].index_add_(0, ids, bias)
            if _below_min_tokens(s):
                banned = set(s.params.stop_token_ids)
                if not s.params.ignore_eos:
                    banned |= self.eos_token_ids
                if banned:
                    logits[i, list(banned)] = float("-inf")
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if constrained:
            self._apply_grammars(logits, seqs, constrained)
        return logits

    def _apply_grammars(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> None:
        if self._bitmask is None or self._bitmask.shape[0] < len(seqs):
            self._bitmask = allocate_bitmask(max(len(seqs), 64), logits.shape[1])
        for i in rows:
            seqs[i].matcher.fill_bitmask(self._bitmask, i)
        apply_bitmask(logits, self._bitmask, rows)
        for i in rows:
            if seqs[i].matcher.banned is not None:
                logits[i, seqs[i].matcher.banned.to(logits.device)] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        vocab = logits.shape[1]
        counts = torch.zeros_like(logits)
        seen = torch.zeros_like(logits, dtype=torch.bool)  # prompt or output: for repetition penalty
        for i, s in enumerate(seqs):
            out = torch.tensor(s.output_token_ids, dtype=torch.long, device=logits.device)
            out = out[out < vocab]
            counts[i].index_add_(0, out, torch.ones_like(out, dtype=counts.dtype))
            seen[i, torch.tensor(s.token_ids, dtype=torch.long, device=logits.device).clamp_(max=vocab - 1)] = True
        rep = self._column(seqs, lambda p: p.repetition_penalty)
        pres = self._column(seqs, lambda p: p.presence_penalty)
        freq = self._column(seqs, lambda p: p.frequency_penalty)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits.copy_(torch.where(seen, penalised, logits))
        logits -= freq * counts + pres * (counts > 0)

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Each row's token; `logits` is not written to."""
        greedy_rows = [s.params.greedy for s in seqs]
        greedy = argmax(logits) if any(greedy_rows) else None
        if all(greedy_rows):
            return greedy
        temps = [s.params.temperature if s.params.temperature > 0 else 1.0 for s in seqs]
        if any(t != 1.0 for t in temps):
            logits = logits / tensor_on(temps, torch.float32, logits.device)[:, None]
        top_ks = [s.params.top_k for s in seqs]
        top_ps = [s.params.top_p for s in seqs]
        if any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps):
            logits = _top_k_top_p(logits, top_ks, top_ps)
        probs = torch.softmax(logits, dim=-1)
        if any(s.params.min_p > 0 for s in seqs):
            min_ps = self._column(seqs, lambda p: p.min_p)
            probs = probs.masked_fill(probs < min_ps * probs.max(dim=-1, keepdim=True).values, 0.0)
        uniforms = torch.rand(len(seqs), device=logits.device)
        for i, s in enumerate(seqs):
            if s.params.seed is not None and not s.params.greedy:
                if s.generator is None:
                    s.generator = self.seeded_generator(s)
                uniforms[i] = draw_uniform(s.generator)
        sampled = _inverse_cdf(probs, uniforms)
        if greedy is None:
            return sampled
        return torch.where(tensor_on(greedy_rows, torch.bool, logits.device), greedy, sampled)

    def seeded_generator(self, seq: Sequence) -> torch.Generator:
        """A seeded sequence's generator: any int64 seed plus the completion's index, wrapped into 64 bits."""
        return torch.Generator(self.device).manual_seed((seq.params.seed + seq.index) % 2**64)

    def _column(self, seqs: list[Sequence], field) -> torch.Tensor:
        return tensor_on([field(s.params) for s in seqs], torch.float32, self.device)[:, None]


def draw_uniform(generator: torch.Generator) -> torch.Tensor:
    """A seeded row's draw for one sampled token: one uniform in [0, 1) from its own generator (the speculative
    verifier replays these to rewind a generator)."""
    return torch.rand(1, generator=generator, device=generator.device)


_CDF_BLOCK = 1024


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Each row's token by inverse transform sampling: the first whose cumulative probability exceeds the row's
    uniform times the row's total. In two levels, so that no probability is lost to rounding in a long float32
    sum and no pass over the vocabulary runs in float64: the block of `_CDF_BLOCK` tokens, by the cumulative
    block sums, then the token within it. A token (or block) of probability 0 is never chosen: its cumulative
    probability equals the one before it."""
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


# top-p first looks for each row's nucleus among its most likely tokens, sorting the whole vocabulary only
# for rows whose nucleus is wider
_NUCLEUS_CANDIDATES = 1024


def _top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Mask everything outside each row's top-k and its top-p nucleus (the fewest most likely tokens whose mass,
    renormalised over the top k, reaches p), by a threshold per row found among its most likely tokens rather
    than a sort of the vocabulary; a row whose k or nucleus reaches past those is sorted."""
    if logits.is_cuda:  # a GPU sorts fast, and the search below would wait for the device to find wide rows
        return _sorted_top_k_top_p(logits, top_ks, top_ps)
    rows, vocab = logits.shape
    ks = [min(k, vocab) if k > 0 else vocab for k in top_ks]
    nucleus = any(p < 1 for p in top_ps)
    cut_ks = [k for k in ks if k < vocab]
    width = min(vocab, _NUCLEUS_CANDIDATES) if nucleus else max(cut_ks, default=0)
    if width == 0:
        return logits
    wide = {i for i, k in enumerate(ks) if width < k < vocab}
    values = logits.topk(width, dim=-1).values  # [rows, width], descending
    k_index = tensor_on([min(k, width) - 1 for k in ks], torch.long, logits.device)[:, None]
    has_k = tensor_on([k < vocab for k in ks], torch.bool, logits.device)
    cut = torch.where(has_k, values.gather(1, k_index)[:, 0], float("-inf"))  # keep logits >= cut
    if nucleus:
        total = torch.logsumexp(logits.masked_fill(logits < cut[:, None], float("-inf")), dim=-1)
        mass = torch.exp(values - total[:, None]).cumsum(dim=-1)  # each candidate's and those above it
        ps = tensor_on(top_ps, torch.float32, logits.device)
        reached = (mass >= ps[:, None]) | (values < cut[:, None])
        found = reached.any(dim=-1)
        last = values.gather(1, reached.float().argmax(dim=-1, keepdim=True))[:, 0]  # the last token kept
        cut = torch.where((ps < 1) & found, torch.maximum(cut, last), cut)
        wide |= {i for i, (p, f) in enumerate(zip(top_ps, found.tolist())) if p < 1 and not f}
    out = logits.masked_fill(logits < cut[:, None], float("-inf"))
    if wide:
        rows_wide = sorted(wide)
        out[rows_wide] = _sorted_top_k_top_p(logits[rows_wide], [top_ks[i] for i in rows_wide],
                                             [top_ps[i] for i in rows_wide])
    return out


def _sorted_top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """`_top_k_top_p` by a full sort: for rows whose nucleus is wider than the candidates looked at."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    ks = tensor_on([min(k, vocab) if k > 0 else vocab for k in top_ks], torch.long, logits.device)[:, None]
    drop = ranks >= ks
    ps = tensor_on(top_ps, torch.float32, logits.device)[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # keep a token while the mass before it is < p
    drop |= mass_before >= ps
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _below_min_tokens(seq: Sequence) -> bool:
    """Whether the token sampled now is still inside `min_tokens` (counting the tokens still in flight)."""
    return seq.num_output_tokens + seq.num_in_flight < seq.params.min_tokens


def token_logprob(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """The logprob and rank of `token_id` in one row of log-probabilities, with the top `num_top`."""
    chosen = logprobs[token_id]
    rank = int((logprobs > chosen).sum()) + 1
    top = []
    if num_top:
        values, ids = logprobs.topk(num_top)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id, float(chosen), rank, top)
