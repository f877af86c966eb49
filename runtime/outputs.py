"""What the engine hands back: per-step deltas, and the finished outputs built from them."""

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """A token's log-probability under the model's raw distribution, with the top alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class SequenceDelta:
    """What one completion gained in a step."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    num_output_tokens: int = 0  # so far, including this step's

    def then(self, later: "SequenceDelta") -> "SequenceDelta":
        """This delta followed by `later` (of the same completion), as one."""
        logprobs = None if self.logprobs is None and later.logprobs is None else \
            (self.logprobs or []) + (later.logprobs or [])
        return SequenceDelta(self.index, self.token_ids + later.token_ids, self.text + later.text, logprobs,
                             later.finish_reason, later.matched_stop, later.num_output_tokens)


@dataclass
class RequestDelta:
    """One step's news for a request: an element of `AsyncLLMEngine.generate`'s stream."""

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    seqs: list[SequenceDelta]
    finished: bool
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first delta only, when asked
    error: str | None = None  # the request failed in the engine and is finished (the engine goes on)
    embedding: list[float] | None = None  # an embedding request's, on its last delta

    def then(self, later: "RequestDelta") -> "RequestDelta":
        """This delta followed by `later` (of the same request), as one: what a consumer that skipped
        a step would have seen."""
        seqs = {s.index: s for s in self.seqs}
        for s in later.seqs:
            seqs[s.index] = seqs[s.index].then(s) if s.index in seqs else s
        return RequestDelta(self.request_id, later.num_prompt_tokens, later.num_cached_tokens, list(seqs.values()),
                            later.finished, self.prompt_logprobs or later.prompt_logprobs, later.error,
                            later.embedding)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finished: bool = False
    error: str | None = None  # why the engine failed this request (its completions end with "error")

    @classmethod
    def empty(cls, request_id: str, prompt_token_ids: list[int], n: int, prompt: str | None = None) -> "RequestOutput":
        """The accumulator of a request with `n` completions, before its first delta."""
        return cls(request_id, prompt, list(prompt_token_ids), outputs=[CompletionOutput(i) for i in range(n)])

    def add(self, delta: RequestDelta) -> None:
        """Fold a step's delta into the accumulated output."""
        self.num_cached_tokens = delta.num_cached_tokens
        self.finished = delta.finished
        self.error = delta.error
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        for d in delta.seqs:
            out = self.outputs[d.index]
            out.token_ids.extend(d.token_ids)
            out.text += d.text
            if d.logprobs is not None:
                if out.logprobs is None:
                    out.logprobs = []
                out.logprobs.extend(d.logprobs)
            out.finish_reason = d.finish_reason
            out.matched_stop = d.matched_stop
