"""/v1/completions on one replica: one or many prompts, `echo`, integer `logprobs`."""

from collections.abc import AsyncIterator

from deployments.openai_format import TokenTexts, completion_logprobs, usage
from deployments.protocol import CompletionRequest
from deployments.request_work import off_loop
from deployments.streams import SSE_DONE, chunk_writer, merge, now
from runtime import AsyncLLMEngine, CompletionOutput, RequestOutput, ValidRequest
from runtime.tokenizer import encode


class CompletionHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str, texts: TokenTexts):
        self.engine = engine
        self.model_id = model_id
        self.texts = texts

    def _prepare(self, req: CompletionRequest):
        """Called on a worker thread: chat templates and tokenizing never hold up the replica's event loop."""
        params = req.to_sampling_params()
        prompts = [encode(self.engine.tokenizer, p) if isinstance(p, str) else list(p) for p in req.prompts()]
        return params, [self.engine.validate(ids, params) for ids in prompts]  # all checked before any starts

    def _streams(self, valid: list[ValidRequest], request_id, priority):
        return [self.engine.generate(v, f"{request_id}-{i}", priority) for i, v in enumerate(valid)]

    async def complete(self, req: CompletionRequest, request_id: str, priority: int = 0) -> dict:
        params, valid = await off_loop(self._prepare, req)
        prompts = [v.prompt_token_ids for v in valid]
        results = [RequestOutput.empty(f"{request_id}-{i}", ids, params.n) for i, ids in enumerate(prompts)]
        async for i, delta in merge(self._streams(valid, request_id, priority)):
            results[i].add(delta)
        choices = []
        for i, result in enumerate(results):
            prompt_text = self.engine.tokenizer.decode(result.prompt_token_ids) if req.echo else ""
            for c in result.outputs:
                choices.append(self._choice(req, i * params.n + c.index, result, c, prompt_text))
        completion_tokens = sum(len(c.token_ids) for r in results for c in r.outputs)
        return {
            "id": request_id,
            "object": "text_completion",
            "created": now(),
            "model": self.model_id,
            "choices": choices,
            "usage": usage(sum(len(p) for p in prompts), completion_tokens, sum(r.num_cached_tokens for r in results)),
        }

    def _choice(self, req: CompletionRequest, index: int, result: RequestOutput, c: CompletionOutput,
                prompt_text: str) -> dict:
        """One choice; `prompt_text` is the decoded prompt with `echo`, else empty."""
        logprobs = None
        if req.logprobs is not None:
            entries, ids = c.logprobs or [], c.token_ids
            if req.echo:
                entries = (result.prompt_logprobs or [None] * len(result.prompt_token_ids)) + entries
                ids = result.prompt_token_ids + ids
            logprobs = completion_logprobs(entries, ids, self.texts)
        return {"index": index, "text": prompt_text + c.text, "logprobs": logprobs,
                "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}

    async def stream(self, req: CompletionRequest, request_id: str) -> AsyncIterator[str]:
        params, valid = await off_loop(self._prepare, req)
        valid = [await self.engine.compile(v) for v in valid]  # a bad grammar is refused before the stream starts
        return self._chunks(req, request_id, params, valid)

    async def _chunks(self, req, request_id, params, valid: list[ValidRequest]) -> AsyncIterator[str]:
        prompts = [v.prompt_token_ids for v in valid]
        chunk = chunk_writer(request_id, "text_completion", self.model_id)
        if req.echo:
            for i, ids in enumerate(prompts):
                prompt_text = self.engine.tokenizer.decode(ids)
                for j in range(params.n):
                    yield chunk([{"index": i * params.n + j, "text": prompt_text, "logprobs": None,
                                  "finish_reason": None}])
        completion_tokens, cached = 0, [0] * len(prompts)
        offsets = {}
        async for i, delta in merge(self._streams(valid, request_id, 0)):
            cached[i] = delta.num_cached_tokens
            for s in delta.seqs:
                index = i * params.n + s.index
                logprobs = None
                if req.logprobs is not None and s.logprobs:
                    logprobs = completion_logprobs(s.logprobs, s.token_ids, self.texts, offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs["tokens"])
                if s.text or logprobs:
                    yield chunk([{"index": index, "text": s.text, "logprobs": logprobs, "finish_reason": None}])
                if s.finish_reason is not None:
                    completion_tokens += s.num_output_tokens
                    yield chunk([{"index": index, "text": "", "logprobs": None,
                                  "finish_reason": s.finish_reason, "matched_stop": s.matched_stop}])
        if req.include_usage:
            yield chunk([], usage=usage(sum(len(p) for p in prompts), completion_tokens, sum(cached)))
        yield SSE_DONE
