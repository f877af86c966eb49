"""Speculative decoding: proposers (prompt lookup, a draft model), the speculator that picks who proposes how
much, and the verifier that keeps the target's output distribution exact."""
