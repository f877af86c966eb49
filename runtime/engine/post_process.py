"""A step's last part: what the tokens a batch sampled do to its sequences (runtime.engine.llm_engine's step is
schedule, run, post-process).

Each sampled token is appended to its sequence, which ends by token id, by length or when its grammar is
complete; verified draft tokens count as computed and the rest give their slots back; an embedding whose prompt is
computed is pooled; a request whose tokens or grammar fail ends alone with an error. What a batch gained comes
back as `TokenRecord`s (one per sequence that gained) and `RequestDelta`s (a request that ended otherwise, or
that asked for prompt logprobs), which the text stage (runtime.engine.text_stage) gives their text.
"""

import logging

from runtime.core.scheduler import Scheduler
from runtime.core.sequence import Request, Sequence, SequenceStatus
from runtime.errors import describe
from runtime.outputs import RequestDelta, SequenceDelta, TokenRecord, sequence_delta
from runtime.worker.step import LaunchedStep, StepResult

logger = logging.getLogger(__name__)


class PostProcessor:
    def __init__(self, scheduler: Scheduler, requests: dict[str, Request], encoder_cache, speculator=None):
        """`requests`: the engine's requests in flight by id, from which those that finish are removed."""
        self.scheduler, self.block_manager = scheduler, scheduler.blocks
        self.requests, self.encoder_cache, self.speculator = requests, encoder_cache, speculator

    def complete(self, launched: LaunchedStep, result: StepResult) -> list:
        """A launched batch's tokens (`result`): a `TokenRecord` per sequence that gained (a delta, for prompt
        logprobs), a delta per request that ended otherwise. Sequences finished meanwhile (an abort, say) are
        passed over."""
        failed = result.failed
        for request, logprobs in result.prompt_logprobs.items():
            request.prompt_logprobs.extend(logprobs)
        records: list = []
        deltas: dict[str, RequestDelta] = {}
        finished = SequenceStatus.FINISHED
        for seq, token_ids, logprobs in zip(launched.sampled, result.token_ids, result.logprobs):
            seq.num_in_flight -= 1
            request = seq.request
            if seq.draft_token_ids:
                self._verified(seq, len(token_ids) - 1, request in failed)
            if seq.status is finished or (failed and request in failed):
                continue
            try:
                record = self._advance(seq, token_ids, logprobs)
            except Exception as e:  # this request's tokens or grammar: it alone fails
                failed[request] = describe(e)
                continue
            if request.params.prompt_logprobs is None:
                records.append(record)
            else:
                delta = deltas.get(request.request_id) or self._request_delta(request)
                deltas[request.request_id] = delta
                delta.seqs.append(sequence_delta(record))
                delta.finished = record.finished
            if record.finished:
                del self.requests[request.request_id]
        for seq in result.pooled:
            if seq.num_computed_tokens == seq.num_tokens and not seq.is_finished:
                deltas[seq.request.request_id] = self._embedded(seq)
        for seq in launched.prefilled:
            if seq.num_computed_tokens == seq.num_tokens and not seq.is_finished and seq.request not in failed:
                delta = deltas.get(seq.request.request_id) or self._request_delta(seq.request)
                deltas[seq.request.request_id] = delta
                self._finish(seq, "length", None)
                delta.seqs.append(SequenceDelta(seq.index, [], "", None, "length", num_output_tokens=0))
                delta.finished = seq.request.finished
        if failed:
            records = [record for record in records if record.request not in failed]
            for request, error in failed.items():
                if not request.finished:
                    deltas[request.request_id] = self._fail(request, error)
        if self.speculator is not None:
            self.speculator.observe(launched)
        for request_id, delta in deltas.items():
            if delta.finished:
                self.requests.pop(request_id, None)
        return records + list(deltas.values()) if deltas else records

    def end_unfinished(self, request: Request, reason: str, seqs: list[Sequence] | None = None) -> RequestDelta:
        """Finish every unfinished completion of `request` (of `seqs`, if given) with `reason`; the delta that says
        so (the text stage gives it the text not yet released)."""
        delta = self._request_delta(request)
        if seqs is None:
            self.encoder_cache.release(request)
        for seq in request.seqs if seqs is None else seqs:
            if not seq.is_finished:
                self._finish(seq, reason, None)
                delta.seqs.append(SequenceDelta(seq.index, [], "", None, reason,
                                                num_output_tokens=seq.num_output_tokens))
        return delta

    def _fail(self, request: Request, error: str) -> RequestDelta:
        """Finish every unfinished completion of `request` with reason "error"; the delta that says so."""
        logger.warning("request %s failed in the engine: %s", request.request_id, error)
        self.block_manager.forget_pictures(request)  # their encoding may have failed: no prompt may hit the blocks
        delta = self.end_unfinished(request, "error")
        delta.error, delta.finished = error, True
        return delta

    def _request_delta(self, request: Request) -> RequestDelta:
        prompt_logprobs = None
        if request.params.prompt_logprobs is not None and all(s.num_output_tokens <= 1 for s in request.seqs):
            prompt_logprobs = [None, *request.prompt_logprobs]
        return RequestDelta(request.request_id, request.num_prompt_tokens, request.num_cached_tokens or 0,
                            [], False, prompt_logprobs)

    def _finish(self, seq: Sequence, reason: str, matched_stop: int | str | None) -> None:
        seq.finish_reason = reason
        seq.matched_stop = matched_stop
        self.scheduler.finish(seq)

    def _verified(self, seq: Sequence, accepted: int, failed: bool) -> None:
        """`seq`'s first `accepted` draft tokens hold; the slots of the rest are released."""
        if not failed:
            seq.num_computed_tokens += accepted
            self.speculator.record(seq, accepted)
            self.block_manager.shrink(seq, seq.num_computed_tokens)
        seq.draft_token_ids = []

    def _advance(self, seq: Sequence, token_ids: list[int], logprobs: list) -> TokenRecord:
        """Append sampled tokens to `seq` (ends by id, length and grammar) until it finishes; its `TokenRecord`."""
        if len(token_ids) == 1:  # the rule: one token a step
            self._append_token(seq, token_ids[0])
            appended = token_ids
        else:
            appended = []
            for token_id in token_ids:
                self._append_token(seq, token_id)
                appended.append(token_id)
                if seq.is_finished:
                    break
        if logprobs[0] is None:
            logprobs = None
        else:
            logprobs = logprobs[: len(appended)]
            seq.logprobs.extend(logprobs)
        reason = seq.finish_reason
        return TokenRecord(seq.request, seq.index, appended, logprobs, reason, seq.matched_stop,
                           len(seq.token_ids) - seq.num_prompt_tokens, reason is not None and seq.request.finished)

    def _embedded(self, seq: Sequence) -> RequestDelta:
        """Finish an embedding request whose whole prompt is computed; the delta carrying its embedding."""
        delta = self._request_delta(seq.request)
        delta.embedding = seq.request.pooling.pool(seq.pooled, seq.num_tokens)
        seq.pooled = None
        self._finish(seq, "stop", None)
        delta.finished = True
        return delta

    def _append_token(self, seq: Sequence, token_id: int) -> None:
        seq.token_ids.append(token_id)
        if seq.matcher is not None:
            seq.matcher.accept(token_id)
            if seq.matcher.done:  # the grammar is complete: nothing else may follow
                self._finish(seq, "stop", token_id)
                return
        if token_id in seq.request.end_token_ids:
            self._finish(seq, "stop", token_id)
        elif len(seq.token_ids) >= seq.request.max_num_tokens:
            self._finish(seq, "length", None)
