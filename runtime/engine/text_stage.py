"""The text of what the engine's steps gained: the deltas made of their records, detokenization, stop strings and
the stream's hold-back, as a stage of its own after the step.

The engine's step ends a sequence only by token (EOS, a stop token id, a grammar's end) or by length, and hands
on records of token ids (runtime.outputs); this stage makes the deltas of them, gives each its text
(runtime.text.detokenizer) and ends a sequence whose text reaches a stop string: the delta it hands on ends
there (its tokens, logprobs and count cut at the stop, as if the engine had stopped it). The engine learns of it
from `take_verdicts` at the start of its next step and retires the sequence then, so a sequence runs at most
one step past its stop; the tokens of that step never reach the caller. A request whose text raises fails
alone, the same way.

So the stage can run on a thread other than the engine's (AsyncLLMEngine runs it on one: the step's critical
path is then appending tokens and deciding ends by id and length), every method holds one lock; a request's
steps must be applied in the order the engine made them.
"""

import threading
from dataclasses import dataclass

from runtime.errors import describe
from runtime.outputs import RequestDelta, SequenceDelta, request_deltas
from runtime.sampling_params import SamplingParams
from runtime.text.detokenizer import IncrementalDetokenizer


@dataclass
class _RequestText:
    detokenizers: list[IncrementalDetokenizer | None] | None  # per completion, None once it ended; None: embedding
    min_tokens: int
    stream: bool  # False: only the last delta of each completion carries text (its whole text)
    ended: bool = False  # every completion ended here before the engine said so: its later deltas are dropped


class TextStage:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._requests: dict[str, _RequestText] = {}
        self._verdicts: list[tuple[str, int | None, str]] = []
        self._lock = threading.Lock()

    def start(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None,
              stream: bool = True) -> None:
        """A request the engine queued; `params` None: an embedding request, which has no text."""
        detokenizers = None if params is None else [
            IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop, params.include_stop_str_in_output,
                                   params.skip_special_tokens, params.stop_regex) for _ in range(params.n)]
        with self._lock:
            self._requests[request_id] = _RequestText(detokenizers, 0 if params is None else params.min_tokens,
                                                      stream)

    def forget(self, request_id: str) -> None:
        """An aborted request: its deltas still to come are dropped."""
        with self._lock:
            self._requests.pop(request_id, None)

    def detokenizer(self, request_id: str, index: int) -> IncrementalDetokenizer | None:
        return self._requests[request_id].detokenizers[index]

    def take_verdicts(self) -> list[tuple[str, int | None, str]]:
        """(request id, completion index or None for all, finish reason) of the completions this stage ended that
        the engine has yet to retire."""
        with self._lock:
            verdicts, self._verdicts = self._verdicts, []
        return verdicts

    def apply(self, step: list) -> list[RequestDelta]:
        """A step's records and deltas (`LLMEngine.step_tokens`) as deltas with their text, ended at stop strings;
        those of completions that ended here are dropped."""
        out = []
        with self._lock:
            for delta in request_deltas(step):
                request = self._requests.get(delta.request_id)
                if request is None:  # aborted
                    continue
                if request.ended or request.detokenizers is None:
                    if delta.finished:
                        del self._requests[delta.request_id]
                    if not request.ended:
                        out.append(delta)
                    continue
                try:
                    delta.seqs = [s for s in delta.seqs if self._text(request, delta.request_id, s)]
                except Exception as e:  # this request's text: it alone fails
                    self._fail(request, delta, describe(e))
                ended_here = not delta.finished and all(d is None for d in request.detokenizers)
                if delta.finished or ended_here:
                    delta.finished = True
                    if ended_here:
                        request.ended = True
                    else:
                        del self._requests[delta.request_id]
                if delta.seqs or delta.finished or delta.error is not None:
                    out.append(delta)
        return out

    def _text(self, request: _RequestText, request_id: str, delta: SequenceDelta) -> bool:
        """Give `delta` its text, ending it at a stop string; False when its completion had already ended here."""
        detokenizer = request.detokenizers[delta.index]
        if detokenizer is None:
            return False
        tokens = delta.token_ids
        # a token that ended the completion (EOS, a stop token, a grammar's end) is not text
        text_tokens = tokens[:-1] if delta.finish_reason == "stop" and isinstance(delta.matched_stop, int) else tokens
        before = delta.num_output_tokens - len(tokens)
        for i, token_id in enumerate(text_tokens):
            stop = detokenizer.append(token_id, check_stop=before + i + 1 >= request.min_tokens)
            if stop is not None:
                if delta.finish_reason is None:  # the engine still runs it
                    self._verdicts.append((request_id, delta.index, "stop"))
                delta.token_ids = tokens[: i + 1]
                if delta.logprobs is not None:
                    delta.logprobs = delta.logprobs[: i + 1]
                delta.num_output_tokens = before + i + 1
                delta.finish_reason, delta.matched_stop = "stop", stop
                break
        final = delta.finish_reason is not None
        if final:
            request.detokenizers[delta.index] = None
        if delta.finish_reason != "error" and (request.stream or final):
            delta.text = detokenizer.release(final)
        return True

    def _fail(self, request: _RequestText, delta: RequestDelta, error: str) -> None:
        """End every completion of the request with an error (the engine retires them at its next step)."""
        delta.seqs = [SequenceDelta(i, [], "", None, "error") for i, d in enumerate(request.detokenizers)
                      if d is not None]
        request.detokenizers = [None] * len(request.detokenizers)
        delta.error = error
        if not delta.finished:
            self._verdicts.append((delta.request_id, None, "error"))
