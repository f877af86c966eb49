"""What the engine hands back: per-step deltas, and the finished outputs built from them."""

from dataclasses import dataclass, field, replace


@dataclass
class TokenLogprob:
    """A token's log-probability under the model's raw distribution, with the top alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass(slots=True)
class SequenceDelta:
    """What one completion gained in a step."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    num_output_tokens: int = 0  # so far, including this step's

    def own_copy(self) -> "SequenceDelta":
        """A copy with lists of its own, that later deltas can be appended to."""
        return SequenceDelta(self.index, list(self.token_ids), self.text,
                             None if self.logprobs is None else list(self.logprobs), self.finish_reason,
                             self.matched_stop, self.num_output_tokens)

    def append(self, later: "SequenceDelta") -> None:
        """`later` (of the same completion) added to this `own_copy`, in place."""
        self.token_ids += later.token_ids
        self.text += later.text
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += later.logprobs
        self.finish_reason, self.matched_stop = later.finish_reason, later.matched_stop
        self.num_output_tokens = later.num_output_tokens


@dataclass(slots=True)
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

    def own_copy(self) -> "RequestDelta":
        """A copy with lists of its own, that later deltas can be appended to: holding back a long answer's deltas
        then costs one pass over its tokens, not a copy of them at every step."""
        return replace(self, seqs=[s.own_copy() for s in self.seqs])

    def append(self, later: "RequestDelta") -> None:
        """`later` (of the same request) added to this `own_copy`, in place: what a consumer that skipped a step
        would have seen."""
        seqs = {s.index: s for s in self.seqs}
        for s in later.seqs:
            if s.index in seqs:
                seqs[s.index].append(s)
            else:
                self.seqs.append(s.own_copy())
        self.num_prompt_tokens, self.num_cached_tokens = later.num_prompt_tokens, later.num_cached_tokens
        self.finished, self.error, self.embedding = later.finished, later.error, later.embedding
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs


@dataclass(slots=True)
class TokenRecord:
    """What a step gained for one completion, as the engine's thread records it; the text stage makes the deltas of
    them (`request_deltas`), off that thread."""

    request: object  # its runtime.core.sequence.Request: the text stage reads what never changes once it runs
    index: int  # the completion's
    token_ids: list[int]  # new this step
    logprobs: list[TokenLogprob] | None  # theirs; None when not asked
    finish_reason: str | None
    matched_stop: int | str | None
    num_output_tokens: int  # so far
    finished: bool  # its request finished with it


def sequence_delta(record: TokenRecord) -> SequenceDelta:
    """The completion's delta a `TokenRecord` says (no text yet)."""
    return SequenceDelta(record.index, record.token_ids, "", record.logprobs, record.finish_reason, record.matched_stop,
                         record.num_output_tokens)


def request_deltas(step: list) -> list[RequestDelta]:
    """A step's `TokenRecord`s and deltas as deltas: the records of one request's completions as one delta, where
    its first record was."""
    out: list[RequestDelta] = []
    made: dict[str, RequestDelta] = {}
    for item in step:
        if isinstance(item, RequestDelta):
            out.append(item)
            continue
        request, finished, seq = item.request, item.finished, sequence_delta(item)
        delta = made.get(request.request_id)
        if delta is None:
            delta = made[request.request_id] = RequestDelta(request.request_id, request.num_prompt_tokens,
                                                            request.num_cached_tokens or 0, [seq], finished)
            out.append(delta)
        else:
            delta.seqs.append(seq)
            delta.finished = delta.finished or finished
    return out


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
