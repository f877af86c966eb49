"""Verification of draft tokens against the target's own samples.

Every proposal here is a point mass (prompt lookup's tokens, a draft model's argmax), and for a point mass
rejection sampling reduces to this: sample the target at each of the k+1 positions exactly as plain decoding
would (same processing, same randomness), keep the drafts up to the first that differs from the target's
sample, then that sample. Draft t is accepted with probability p(t); on a rejection the emitted token is
distributed as p without t, renormalised; so every emitted token has the target's distribution, greedy
tokens are the argmax, and logprobs are the target's. A seeded row's uniform depends only on the position it
samples (runtime.worker.sampler), so a seeded sequence's tokens equal plain decoding's whatever was proposed.
"""


from runtime.core.sequence import Sequence
from runtime.outputs import TokenLogprob


def accepted_length(drafts: list[int], samples: list[int]) -> int:
    """How many drafts match the target's samples (`samples` has one row more than `drafts`)."""
    n = 0
    while n < len(drafts) and drafts[n] == samples[n]:
        n += 1
    return n


def split_rows(seqs: list[Sequence], tokens: list[int], logprobs: list[TokenLogprob | None]
               ) -> tuple[list[list[int]], list[list[TokenLogprob | None]]]:
    """Each sequence's emitted tokens and their logprobs, from the sampled rows (1 + its drafts each)."""
    if len(tokens) == len(seqs):  # no drafts: a row each
        return [[token] for token in tokens], [[logprob] for logprob in logprobs]
    out_tokens, out_logprobs, row = [], [], 0
    for seq in seqs:
        drafts = seq.draft_token_ids
        samples = tokens[row : row + 1 + len(drafts)]
        emitted = accepted_length(drafts, samples) + 1
        out_tokens.append(samples[:emitted])
        out_logprobs.append(logprobs[row : row + emitted])
        row += 1 + len(drafts)
    return out_tokens, out_logprobs
