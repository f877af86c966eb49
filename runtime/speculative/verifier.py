"""Verification of draft tokens against the target's own samples.

Every proposal here is a point mass (prompt lookup's tokens, a draft model's argmax), and for a point mass
rejection sampling reduces to this: sample the target at each of the k+1 positions exactly as plain decoding
would (same processing, same randomness), keep the drafts up to the first that differs from the target's
sample, then that sample. Draft t is accepted with probability p(t); on a rejection the emitted token is
distributed as p without t, renormalised; so every emitted token has the target's distribution, greedy
tokens are the argmax, and logprobs are the target's. A seeded sequence's generator is rewound to where it
stands after the rows it emitted, so its tokens equal plain decoding's whatever was proposed.
"""


from runtime.core.sequence import Sequence
from runtime.outputs import TokenLogprob
from runtime.worker.sampler import draw_uniform


def accepted_length(drafts: list[int], samples: list[int]) -> int:
    """How many drafts match the target's samples (`samples` has one row more than `drafts`)."""
    n = 0
    while n < len(drafts) and drafts[n] == samples[n]:
        n += 1
    return n


class GeneratorRewind:
    """Seeded sequences' generator states before a verification, to replay only the rows they emit."""

    def __init__(self, seqs: list[Sequence], make_generator):
        self._make = make_generator  # a fresh generator for a sequence, as the sampler seeds it
        self._states = {s: None if s.generator is None else s.generator.get_state()
                        for s in seqs if s.draft_token_ids and s.params.seed is not None and not s.params.greedy}

    def rewind(self, seq: Sequence, rows: int) -> None:
        """Leave `seq`'s generator as if it had drawn for `rows` sampled rows since the snapshot."""
        if seq not in self._states:
            return
        state = self._states[seq]
        if state is None:
            seq.generator = self._make(seq)
        else:
            seq.generator.set_state(state)
        for _ in range(rows):  # the sampler draws once per sampled row
            draw_uniform(seq.generator)


def split_rows(seqs: list[Sequence], tokens: list[int], logprobs: list[TokenLogprob | None],
               rewind: GeneratorRewind) -> tuple[list[list[int]], list[list[TokenLogprob | None]]]:
    """Each sequence's emitted tokens and their logprobs, from the sampled rows (1 + its drafts each)."""
    out_tokens, out_logprobs, row = [], [], 0
    for seq in seqs:
        drafts = seq.draft_token_ids
        samples = tokens[row : row + 1 + len(drafts)]
        emitted = accepted_length(drafts, samples) + 1
        rewind.rewind(seq, emitted)
        out_tokens.append(samples[:emitted])
        out_logprobs.append(logprobs[row : row + emitted])
        row += 1 + len(drafts)
    return out_tokens, out_logprobs
