"""Which sequences speculate this step, how many tokens each proposes, and what the verifier made of them.

A sequence proposes only while the verifier can reproduce plain decoding exactly: not with penalties (they
depend on every earlier output token), a structured-output grammar or an unmet `min_tokens`; those decode
plainly. Proposals adapt: each sequence keeps a decayed estimate of how often a draft token is accepted and
proposes only the positions whose chance of being reached stays above `MIN_REACH`, probing with one token
every `PROBE_EVERY` steps after it stops; no sequence proposes in a step where more than
`disable_by_batch_size` sequences decode (a large batch is compute-bound: verifying costs what it saves).
"""

from dataclasses import dataclass, field

from runtime.config import SpeculativeConfig
from runtime.core.sequence import Sequence
from runtime.speculative.ngram import NgramIndex

MIN_REACH = 0.3
PROBE_EVERY = 8
_DECAY = 0.8


@dataclass
class SequenceSpeculation:
    """One sequence's speculation state (`Sequence.speculation`); a preempted sequence starts afresh."""

    hits: float = 4.0  # decayed accepted draft tokens: with `trials`, a prior of 0.8 per token
    trials: float = 5.0
    idle: int = 0  # steps since it last proposed, while its estimate is too low
    ngram: NgramIndex = field(default_factory=NgramIndex)
    draft_valid: int = 0  # tokens whose keys and values the draft model holds
    # a multi-token predictor's first draft for the sequence at a length: (length, token, the layer's output there)
    next_draft: tuple | None = None

    def num_drafts(self, k: int) -> int:
        rate = self.hits / self.trials
        n = 0
        while n < k and rate ** (n + 1) >= MIN_REACH:
            n += 1
        if n:
            self.idle = 0
            return n
        self.idle += 1
        if self.idle >= PROBE_EVERY:
            self.idle = 0
            return 1
        return 0

    def record(self, proposed: int, accepted: int) -> None:
        self.hits = _DECAY * self.hits + accepted
        self.trials = _DECAY * self.trials + accepted + (accepted < proposed)


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer, max_model_len: int):
        self.config = config
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.num_drafts = 0  # verifications of at least one draft token
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def propose(self, running: list[Sequence]) -> None:
        """Set each running sequence's `draft_token_ids` for the coming step (most get none)."""
        decoding = []
        for seq in running:
            seq.draft_token_ids = []
            if seq.num_tokens - seq.num_computed_tokens == 1 and _exact(seq):
                decoding.append(seq)
        if len(decoding) > self.config.disable_by_batch_size:
            return
        for seq in decoding:
            room = min(seq.request.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
            if room <= 0:
                continue
            if seq.speculation is None:
                seq.speculation = SequenceSpeculation()
            k = seq.speculation.num_drafts(min(self.config.num_speculative_tokens, room))
            if k:
                seq.draft_token_ids = self.proposer.propose(seq, seq.speculation, k)

    def scheduled(self, seqs: list[Sequence]) -> None:
        """The scheduled sequences' proposals made final (a draft model fills the slots it was given)."""
        self.proposer.complete([s for s in seqs if s.draft_token_ids])

    def observe(self, step) -> None:
        """A step's tokens are in (`LaunchedStep`, counted and appended): what the proposer learns from it."""
        self.proposer.observe(step)

    def record(self, seq: Sequence, accepted: int) -> None:
        """`accepted` of `seq`'s draft tokens matched the target's; its state follows."""
        proposed = len(seq.draft_token_ids)
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        state = seq.speculation
        state.record(proposed, accepted)
        state.draft_valid = min(state.draft_valid, seq.num_computed_tokens)

    def stats(self) -> dict:
        drafts, proposed, accepted = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        return {
            "spec_num_drafts": drafts,
            "spec_num_draft_tokens": proposed,
            "spec_num_accepted_tokens": accepted,
            "spec_acceptance_rate": accepted / proposed if proposed else 0.0,
            "spec_mean_accepted_length": 1 + accepted / drafts if drafts else 0.0,  # tokens per verification
        }


def _exact(seq: Sequence) -> bool:
    """Whether verifying drafts reproduces plain decoding exactly for `seq` (else it decodes plainly)."""
    p = seq.params
    return not (p.uses_penalties or seq.matcher is not None or seq.num_output_tokens < p.min_tokens
                or seq.request.pooling is not None)
