"""One batched sampling pass over every sequence that needs a token this step.

Order: penalties, logit bias, min-tokens masking, the structured-output
grammar bitmask, greedy argmax, then
temperature, top-k, top-p, min-p and sampling. Sampling uses the exponential
race (argmax of p / q with q ~ Exp(1)), which is an exact draw from p; seeded
sequences draw their q from their own generator, so their tokens do not
depend on the rest of the batch. Logprobs are taken from the raw model
distribution (before any processing), as OpenAI reports them.
"""

import torch

from runtime.grammar import allocate_bitmask, apply_bitmask
from runtime.outputs import TokenLogprob
from runtime.sequence import Sequence


class Sampler:
    def __init__(self, eos_token_ids: set[int], device: torch.device):
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._bitmask = None  # grammar bitmask rows, reused across steps

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        if all(s.params.greedy and s.params.logprobs is None and not self._processes(s) for s in seqs):
            return logits.argmax(dim=-1).tolist(), [None] * len(seqs)  # argmax is exact in the model's dtype
        logits = logits.float()
        raw_logprobs = None
        if any(s.params.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._process(logits.clone(), seqs)
        tokens = self._choose(logits, seqs)
        token_list = tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            for i, s in enumerate(seqs):
                if s.params.logprobs is not None:
                    logprobs[i] = token_logprob(raw_logprobs[i], token_list[i], s.params.logprobs)
        return token_list, logprobs

    def _processes(self, s: Sequence) -> bool:
        """Whether `_process` changes this sequence's logits."""
        p = s.params
        return p.uses_penalties or bool(p.logit_bias) or s.num_output_tokens < p.min_tokens or s.matcher is not None

    def _process(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        if any(s.params.uses_penalties for s in seqs):
            self._apply_penalties(logits, seqs)
        for i, s in enumerate(seqs):
            if s.params.logit_bias:
                ids = torch.tensor(list(s.params.logit_bias), device=logits.device)
                bias = torch.tensor(list(s.params.logit_bias.values()), device=logits.device)
                logits[i].index_add_(0, ids, bias)
            if s.num_output_tokens < s.params.min_tokens:
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
        greedy = logits.argmax(dim=-1)
        if all(s.params.greedy for s in seqs):
            return greedy
        temps = self._column(seqs, lambda p: p.temperature if p.temperature > 0 else 1.0)
        logits = logits / temps
        top_ks = [s.params.top_k for s in seqs]
        top_ps = [s.params.top_p for s in seqs]
        if any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps):
            logits = _top_k_top_p(logits, top_ks, top_ps)
        probs = torch.softmax(logits, dim=-1)
        min_ps = self._column(seqs, lambda p: p.min_p)
        if (min_ps > 0).any():
            probs = probs.masked_fill(probs < min_ps * probs.max(dim=-1, keepdim=True).values, 0.0)
        q = torch.empty_like(probs).exponential_()
        for i, s in enumerate(seqs):
            if s.params.seed is not None and not s.params.greedy:
                if s.generator is None:
                    s.generator = self.seeded_generator(s)
                q[i].exponential_(generator=s.generator)
        sampled = (probs / q).argmax(dim=-1)
        is_greedy = torch.tensor([s.params.greedy for s in seqs], device=logits.device)
        return torch.where(is_greedy, greedy, sampled)

    def seeded_generator(self, seq: Sequence) -> torch.Generator:
        """A seeded sequence's generator: any int64 seed plus the completion's index, wrapped into 64 bits."""
        return torch.Generator(self.device).manual_seed((seq.params.seed + seq.index) % 2**64)

    def _column(self, seqs: list[Sequence], field) -> torch.Tensor:
        return torch.tensor([field(s.params) for s in seqs], dtype=torch.float32, device=self.device)[:, None]


def _top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Mask everything outside each row's top-k and its top-p nucleus."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    ks = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_ks], device=logits.device)[:, None]
    drop = ranks >= ks
    ps = torch.tensor(top_ps, device=logits.device)[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # keep a token while the mass before it is < p
    drop |= mass_before >= ps
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def token_logprob(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """The logprob and rank of `token_id` in one row of log-probabilities, with the top `num_top`."""
    chosen = logprobs[token_id]
    rank = int((logprobs > chosen).sum()) + 1
    top = []
    if num_top:
        values, ids = logprobs.topk(num_top)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id, float(chosen), rank, top)
