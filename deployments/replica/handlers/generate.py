"""SGLang's native /generate on one replica: `text` or `input_ids`, cumulative streaming, `meta_info`."""

import time
from collections.abc import AsyncIterator

from deployments.api.generate.protocol import GenerateRequest
from deployments.api.ids import new_id
from deployments.replica.adapters import ModelAdapters
from deployments.replica.merge import merge
from deployments.route_marks import marked
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, CompletionOutput, RequestOutput, ValidRequest


class GenerateHandler:
    def __init__(self, engine: AsyncLLMEngine, adapters: ModelAdapters):
        self.engine = engine
        self.adapters = adapters

    def _prepare(self, req: GenerateRequest):
        """Called on a worker thread: chat templates and tokenizing never hold up the replica's event loop."""
        params = req.sampling_params.to_sampling_params(req.top_logprobs_num if req.return_logprob else None)
        prompts, batched = req.prompts()
        ids = [self.engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        lora = self.adapters.request_for(req.model)
        valid = [self.engine.validate(prompt, params, lora) for prompt in ids]  # all checked before any starts
        valid[:1] = [marked(v, req) for v in valid[:1]]
        base = req.rid or new_id("")
        request_ids = [base if len(ids) == 1 else f"{base}-{i}" for i in range(len(ids))]
        return params, valid, batched, request_ids

    def _run(self, params, valid: list[ValidRequest], request_ids, priority: int = 0, owner: str | None = None,
             stream: bool = True):
        """Accumulators for every prompt (labelled with the client's ids), and the merged stream of their
        (prompt index, delta). The engine's ids are always new: a client's `rid` names its reply, never
        another client's request in flight."""
        results = [RequestOutput.empty(rid, v.prompt_token_ids, params.n) for rid, v in zip(request_ids, valid)]
        streams = [self.engine.generate(v, new_id("generate-"), priority, owner, stream) for v in valid]
        return results, merge(streams)

    async def complete(self, req: GenerateRequest, priority: int = 0, owner: str | None = None) -> dict | list[dict]:
        params, valid, batched, request_ids = await off_loop(self._prepare, req)
        start = time.perf_counter()
        results, deltas = self._run(params, valid, request_ids, priority, owner, stream=False)
        async for i, delta in deltas:
            results[i].add(delta)
        latency = time.perf_counter() - start
        items = [self._item(r, c, params.max_tokens, latency) for r in results for c in r.outputs]
        return items if batched or params.n > 1 else items[0]

    def _item(self, result: RequestOutput, c: CompletionOutput, max_new_tokens: int, latency: float) -> dict:
        meta = {
            "id": result.request_id,
            "finish_reason": _finish_reason(c.finish_reason, c.matched_stop, max_new_tokens),
            "prompt_tokens": len(result.prompt_token_ids),
            "completion_tokens": len(c.token_ids),
            "cached_tokens": result.num_cached_tokens,
            "e2e_latency": latency,
        }
        if c.logprobs is not None:
            meta["output_token_logprobs"] = [[e.logprob, e.token_id, None] for e in c.logprobs]
        return {"text": c.text, "output_ids": list(c.token_ids), "meta_info": meta}

    async def stream(self, req: GenerateRequest, owner: str | None = None) -> AsyncIterator[dict]:
        params, valid, _, request_ids = await off_loop(self._prepare, req)
        valid = [await self.engine.compile(v) for v in valid]  # a bad grammar is refused before the stream starts
        return self._chunks(params, valid, request_ids, owner)

    async def _chunks(self, params, valid: list[ValidRequest], request_ids, owner) -> AsyncIterator[dict]:
        start = time.perf_counter()
        results, deltas = self._run(params, valid, request_ids, owner=owner)
        async for i, delta in deltas:
            results[i].add(delta)
            for s in delta.seqs:
                c = results[i].outputs[s.index]
                item = self._item(results[i], c, params.max_tokens, time.perf_counter() - start)
                item["index"] = i * params.n + s.index
                yield item


def _finish_reason(reason: str | None, matched: int | str | None, max_new_tokens: int) -> dict | None:
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": max_new_tokens}
    if reason == "stop":
        return {"type": "stop", "matched": matched}
    return {"type": reason}
