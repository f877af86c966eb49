"""One batched sampling pass over every sequence that needs a token this step.

Order: penalties, logit bias, min-tokens masking, the structured-output
grammar bitmask, then greedy argmax, temperature, top-k, top-p, min-p and the
draw, in one kernel (kernels.sample): inverse transform sampling, one uniform
per row. A seeded sequence's uniform is a function of its seed and the position
of the token it samples (`seeded_uniform`), so its tokens do not depend on the
rest of the batch, and a verification that rejects draft tokens needs no
rewinding. Logprobs are taken from the raw model distribution (before any
processing), as OpenAI reports them.
"""

import torch

from kernels import argmax, sample, tensor_on
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

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's tokens, left on the device, and the raw log-probabilities that `logprobs` reads (None
        when no row reports logprobs). Queues the work without waiting for the device, unless a row has
        penalties, a logit bias, an unmet min_tokens or a grammar (their masks are built on the host).
        `offsets`: as `uniforms` takes them."""
        if all(s.params.greedy and s.params.logprobs is None and not self._processes(s) for s in seqs):
            return argmax(logits), None  # argmax is exact in the model's dtype
        logits = logits.float()
        raw_logprobs = None
        if any(s.params.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if any(self._processes(s) for s in seqs):
            logits = self._process(logits.clone(), seqs)
        return self._choose(logits, seqs, offsets), raw_logprobs

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

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None) -> torch.Tensor:
        """Each row's token (kernels.sample); `logits` is not written to."""
        if all(s.params.greedy for s in seqs):
            return argmax(logits)
        params = [s.params for s in seqs]
        device = logits.device
        temperatures = tensor_on([0.0 if p.greedy else p.temperature for p in params], torch.float32, device)
        top_ks = tensor_on([min(p.top_k, logits.shape[1]) for p in params], torch.long, device)
        top_ps = tensor_on([p.top_p for p in params], torch.float32, device)
        min_ps = tensor_on([p.min_p for p in params], torch.float32, device)
        return sample(logits, temperatures, top_ks, top_ps, min_ps, self.uniforms(seqs, offsets).to(device))

    @staticmethod
    def uniforms(seqs: list[Sequence], offsets: list[int] | None = None) -> torch.Tensor:
        """Each row's uniform, float64 on the host: a seeded sequence's from its seed and the position of the token
        the row samples, the rest at random. `offsets`: each row's position after its sequence's next token
        (`draw_offsets`; by default, as the rows' order says)."""
        offsets = draw_offsets(seqs) if offsets is None else offsets
        out = torch.rand(len(seqs), dtype=torch.float64).tolist()
        for i, s in enumerate(seqs):
            if s.params.seed is not None:
                out[i] = seeded_uniform(s.params.seed + s.index, s.num_output_tokens + s.num_in_flight + offsets[i])
        return torch.tensor(out, dtype=torch.float64)

    def _column(self, seqs: list[Sequence], field) -> torch.Tensor:
        return tensor_on([field(s.params) for s in seqs], torch.float32, self.device)[:, None]


def draw_offsets(seqs: list[Sequence]) -> list[int]:
    """Each row's offset from its sequence's next token: 0, or 1, 2, ... for the rows that follow it (a verified
    draft's tokens)."""
    offsets, previous = [], None
    for s in seqs:
        offsets.append(offsets[-1] + 1 if s is previous else 0)
        previous = s
    return offsets


_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers whose outputs look independent of its inputs."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, position: int) -> float:
    """A counter-based uniform in [0, 1): a function of the seed (any int64 plus the completion's index) and the
    output position alone, so a seeded completion's draws do not depend on its batch, on preemption or on which
    draft tokens a verification rejected."""
    key = _mix64((seed & _MASK64) ^ 0x9E3779B97F4A7C15)
    return (_mix64((key + position * 0xD1B54A32D192ED03) & _MASK64) >> 11) * 2.0**-53


def _below_min_tokens(seq: Sequence) -> bool:
    """Whether the token sampled now is still inside `min_tokens` (counting the tokens still in flight)."""
    return seq.num_output_tokens + seq.num_in_flight < seq.params.min_tokens


# what a logprob of -inf (or NaN: an over-sharpened distribution) is reported as, vLLM's stand-in: the replies are
# JSON, which has no infinities
LOGPROB_FLOOR = -9999.0


def token_logprob(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """The logprob and rank of `token_id` in one row of log-probabilities, with the top `num_top` (each at least
    `LOGPROB_FLOOR`)."""
    logprobs = logprobs.nan_to_num(nan=LOGPROB_FLOOR, posinf=0.0).clamp(min=LOGPROB_FLOOR)
    chosen = logprobs[token_id]
    rank = int((logprobs > chosen).sum()) + 1
    top = []
    if num_top:
        values, ids = logprobs.topk(num_top)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id, float(chosen), rank, top)
