"""/v1/completions on one replica: one or many prompts, `echo`, integer `logprobs`."""

from collections.abc import AsyncIterator

from deployments.api.completions.protocol import CompletionRequest
from deployments.api.format import TokenTexts, chunk_builder, completion_logprobs, now, prompt_logprobs_json, usage
from deployments.api.request_model import engine_priority
from deployments.replica.adapters import ModelAdapters
from deployments.replica.merge import merge
from deployments.route_marks import marked
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, CompletionOutput, RequestOutput, ValidRequest


class CompletionHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str, texts: TokenTexts, adapters: ModelAdapters):
        self.engine = engine
        self.adapters = adapters
        self.model_id = model_id
        self.texts = texts

    def _prepare(self, req: CompletionRequest):
        """Called on a worker thread: chat templates and tokenizing never hold up the replica's event loop."""
        params = req.to_sampling_params()
        prompts = [self.engine.encode(p) if isinstance(p, str) else list(p) for p in req.prompts()]
        lora = self.adapters.request_for(req.model)
        valid = [self.engine.validate(ids, params, lora) for ids in prompts]  # all checked before any starts
        valid[:1] = [marked(v, req) for v in valid[:1]]
        return params, valid

    def _streams(self, valid: list[ValidRequest], request_id, priority, owner, stream: bool):
        return [self.engine.generate(v, f"{request_id}-{i}", priority, owner, stream) for i, v in enumerate(valid)]

    async def complete(self, req: CompletionRequest, request_id: str, priority: int = 0,
                       owner: str | None = None) -> dict:
        params, valid = await off_loop(self._prepare, req, priority=priority)
        prompts = [v.prompt_token_ids for v in valid]
        results = [RequestOutput.empty(f"{request_id}-{i}", ids, params.n) for i, ids in enumerate(prompts)]
        streams = self._streams(valid, request_id, engine_priority(priority, req.priority), owner, stream=False)
        async for i, delta in merge(streams):
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
            "model": self.adapters.model_name(req.model),
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
        choice = {"index": index, "text": prompt_text + c.text, "logprobs": logprobs,
                  "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}
        # always present (null when not asked): vLLM's clients read it
        choice["prompt_logprobs"] = (prompt_logprobs_json(result.prompt_logprobs or [], self.texts)
                                     if req.prompt_logprobs is not None else None)
        if req.return_token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = result.prompt_token_ids, c.token_ids
        return choice

    async def stream(self, req: CompletionRequest, request_id: str, owner: str | None = None) -> AsyncIterator[dict]:
        params, valid = await off_loop(self._prepare, req)
        valid = [await self.engine.compile(v) for v in valid]  # a bad grammar is refused before the stream starts
        return self._chunks(req, request_id, params, valid, owner)

    def _echo(self, req, i: int, prompt: list[int], n: int, prompt_logprobs, offsets: dict) -> list[dict]:
        """The echoed prompt of prompt `i`, once per choice, with its logprobs when asked (they come with the
        prompt's first delta); sets where each choice's offsets continue."""
        text = self.engine.tokenizer.decode(prompt)
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(prompt_logprobs or [None] * len(prompt), prompt, self.texts)
        for j in range(n):
            offsets[i * n + j] = sum(len(t) for t in logprobs["tokens"]) if logprobs else 0
        return [{"index": i * n + j, "text": text, "logprobs": logprobs, "finish_reason": None} for j in range(n)]

    async def _chunks(self, req, request_id, params, valid: list[ValidRequest], owner) -> AsyncIterator[dict]:
        prompts = [v.prompt_token_ids for v in valid]
        chunk = chunk_builder(request_id, "text_completion", self.adapters.model_name(req.model))
        completion_tokens, generated, cached = 0, 0, [0] * len(prompts)
        offsets = {}  # each choice's text offset so far, for its logprobs
        ids_sent: set[int] = set()  # choices whose prompt_token_ids went out (return_token_ids)

        prompt_tokens = sum(len(p) for p in prompts)

        def extra() -> dict:  # usage so far on every chunk, with continuous_usage_stats
            return {"usage": usage(prompt_tokens, generated, sum(cached))} if req.usage_on_every_chunk else {}

        async for i, delta in merge(self._streams(valid, request_id, req.priority, owner, stream=True)):
            cached[i] = delta.num_cached_tokens
            if req.echo and i * params.n not in offsets:  # this prompt's first delta
                for item in self._echo(req, i, prompts[i], params.n, delta.prompt_logprobs, offsets):
                    yield chunk([item], **extra())
            for s in delta.seqs:
                index = i * params.n + s.index
                generated += len(s.token_ids)
                logprobs = None
                if req.logprobs is not None:  # every chunk of a logprobs request carries them
                    logprobs = completion_logprobs(s.logprobs or [], s.token_ids, self.texts, offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs["tokens"])
                if s.text or s.token_ids or s.finish_reason is not None:  # the last token carries finish_reason
                    item = {"index": index, "text": s.text, "logprobs": logprobs, "finish_reason": s.finish_reason}
                    if s.finish_reason is not None:
                        completion_tokens += s.num_output_tokens
                        item["matched_stop"] = s.matched_stop
                    if req.return_token_ids:
                        item["token_ids"] = s.token_ids
                        if index not in ids_sent:
                            item["prompt_token_ids"] = prompts[i]
                            ids_sent.add(index)
                    yield chunk([item], **extra())
        if req.include_usage:
            yield chunk([], usage=usage(prompt_tokens, completion_tokens, sum(cached)))
