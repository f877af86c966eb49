"""/score, /rerank and /classify on one replica of a pooling model (engine option `runner: pooling`): a
classifier's probabilities, or an embedding model's cosines (`runtime.scoring`), in vLLM's reply shapes."""

from deployments.api.request_model import engine_priority
from deployments.api.scores.protocol import ClassifyRequest, RerankRequest, ScoreRequest, ScoringFields
from deployments.errors import OpenAIError
from deployments.replica.handlers.embeddings import list_reply, pool_all, validated_inputs
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, ValidRequest
from runtime.pooling import label_probabilities
from runtime.scoring import ScoringPlan


class ScoreHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str):
        self.engine = engine
        self.model_id = model_id

    async def score(self, req: ScoreRequest, request_id: str, priority: int = 0, owner: str | None = None) -> dict:
        scores, tokens = await self._scores(req, req.text_1, req.text_2, ("text_1", "text_2"), request_id, priority,
                                            owner)
        return list_reply(request_id, self.model_id,
                          [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)], tokens)

    async def rerank(self, req: RerankRequest, request_id: str, priority: int = 0, owner: str | None = None) -> dict:
        scores, tokens = await self._scores(req, [req.query], req.documents, ("query", "documents"), request_id,
                                            priority, owner)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n or None]
        results = [{"index": i, "relevance_score": scores[i]} for i in ranked]
        if req.return_documents:
            for result in results:
                result["document"] = {"text": req.documents[result["index"]]}
        return {"id": request_id, "model": self.model_id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "results": results}

    async def classify(self, req: ClassifyRequest, request_id: str, priority: int = 0,
                       owner: str | None = None) -> dict:
        labels = self.engine.labels
        if labels is None:
            raise OpenAIError(400, f"model: {self.model_id!r} is not a classifier: it serves /v1/embeddings, /score "
                                   "and /rerank", "model")
        valid = await off_loop(validated_inputs, self.engine, req.inputs(), priority=priority)
        logits, tokens = await pool_all(self.engine, valid, request_id, engine_priority(priority, req.priority),
                                        owner)
        data = []
        for i, values in enumerate(logits):
            probs = label_probabilities(values) if req.use_activation is not False else values
            data.append({"index": i, "label": labels[max(range(len(probs)), key=probs.__getitem__)], "probs": probs,
                         "num_classes": len(probs)})
        return list_reply(request_id, self.model_id, data, tokens)

    async def _scores(self, req: ScoringFields, first: list[str], second: list[str], names: tuple[str, str],
                      request_id: str, priority: int, owner: str | None) -> tuple[list[float], int]:
        """The pairs' scores and the tokens pooled for them."""
        limits = (req.max_tokens_per_query, req.max_tokens_per_doc)
        plan, valid = await off_loop(self._plan, first, second, names, limits, priority=priority)
        pooled, tokens = await pool_all(self.engine, valid, request_id, engine_priority(priority, req.priority),
                                        owner)
        return plan.scores(pooled, req.use_activation is not False), tokens

    def _plan(self, first: list[str], second: list[str], names: tuple[str, str], limits: tuple[int, int]
              ) -> tuple[ScoringPlan, list[ValidRequest]]:
        """Called on a worker thread: the prompts tokenized and checked before any runs."""
        plan = ScoringPlan.make(self.engine.tokenizer, self.engine.validator.spec.hf_config, self.engine.labels,
                                first, second, names, limits)
        return plan, validated_inputs(self.engine, plan.prompts)
