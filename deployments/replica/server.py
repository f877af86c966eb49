"""The replica deployment: one AsyncLLMEngine serving chat, completions and /generate for one model, or
embeddings, scores and classes when it is a pooling model (engine option `runner: pooling`)."""

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator

from ray import serve

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.api.completions.protocol import CompletionRequest
from deployments.api.embeddings.protocol import EmbeddingRequest, PoolingRequest
from deployments.api.format import TokenTexts
from deployments.api.generate.protocol import GenerateRequest
from deployments.api.ids import new_id
from deployments.api.scores.protocol import ClassifyRequest, PoolingCall, RerankRequest, ScoreRequest
from deployments.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from deployments.app_config import LLMConfig
from deployments.broadcast import on_every_replica
from deployments.errors import ENGINE_DEAD, OpenAIError, StreamError
from deployments.media import MediaLoader, MediaPolicy
from deployments.replica.adapters import adapters_of
from deployments.replica.encoder_server import EncoderClient
from deployments.replica.handlers.chat import ChatHandler
from deployments.replica.handlers.completions import CompletionHandler
from deployments.replica.handlers.embeddings import EmbeddingHandler
from deployments.replica.handlers.generate import GenerateHandler
from deployments.replica.handlers.scores import ScoreHandler
from deployments.replica.handlers.tokenize import TokenizeHandler
from deployments.replica.metrics import EngineGauges, RequestMetrics
from deployments.tracing import Observers, RequestSpans, continued, start_tracing, tracing
from runtime import (
    AsyncLLMEngine,
    ContextLengthError,
    EngineDeadError,
    InvalidInputError,
    RequestFailedError,
    SamplingParams,
)
from runtime.engine.startup_heap import freeze_startup_heap

logger = logging.getLogger("ray.serve")

PUBLISH_TIMEOUT_S = 10.0  # a disaggregated prefill's wait for its blocks to reach the shared tier's directory

class LLMServer:
    def __init__(self, config: LLMConfig, otlp_traces_endpoint: str | None = None, media: MediaPolicy = MediaPolicy(),
                 encoder=None):
        """`otlp_traces_endpoint`: where this replica's spans go (deployments/tracing.py); None: it makes none.
        `media`: where pictures named by URL may be read from (deployments/media.py). `encoder`: a handle to the
        model's image encoder deployment (`encoder_config`), if it has one."""
        self.model_id = config.model_id
        start_tracing(otlp_traces_endpoint, f"rayllm-replica {self.model_id}")
        # new tokens reach this process at most once per interval: fewer wake-ups, SSE events and hops per token
        interval_s = config.experimental_configs.stream_batching_interval_ms / 1000
        # warmed up before this replica says ready, unless engine_kwargs say warm_up: false
        started = time.perf_counter()
        observer = self.request_metrics = RequestMetrics(self.model_id)
        if tracing():
            observer = Observers(observer, RequestSpans(self.model_id))
        self.engine = AsyncLLMEngine.from_options(config.model_loading_config.source, interval_s, observer,
                                                  **{"warm_up": True, **config.engine_options})
        logger.info("model %s: engine loaded and warmed up in %.1f s", self.model_id, time.perf_counter() - started)
        texts = TokenTexts(self.engine.tokenizer)
        self.adapters = adapters = adapters_of(config)
        self.chat_handler = ChatHandler(self.engine, self.model_id, texts, adapters, config.reasoning_parser,
                                        config.tool_call_parser, MediaLoader(media),
                                        EncoderClient(encoder) if encoder is not None else None)
        self.completion_handler = CompletionHandler(self.engine, self.model_id, texts, adapters)
        self.generate_handler = GenerateHandler(self.engine, adapters)
        self.embedding_handler = EmbeddingHandler(self.engine, self.model_id)
        scores = ScoreHandler(self.engine, self.model_id)
        self.pooling_routes = {PoolingRequest: (self.embedding_handler.pool, "pool-"),
                               ScoreRequest: (scores.score, "score-"), RerankRequest: (scores.rerank, "rerank-"),
                               ClassifyRequest: (scores.classify, "classify-")}
        self.tokenize_handler = TokenizeHandler(self.engine, self.chat_handler.prompt, self.chat_handler.pictures)
        threading.Thread(target=self._report_gauges, args=(EngineGauges(self.model_id),), name="gauges",
                         daemon=True).start()
        threading.Thread(target=self._leave_when_the_engine_dies, name="engine-watch", daemon=True).start()
        freeze_startup_heap()

    def _report_gauges(self, gauges: EngineGauges) -> None:
        while self.engine.healthy:
            gauges.update(self.engine.stats())
            time.sleep(1)

    def _leave_when_the_engine_dies(self) -> None:
        """A replica whose engine died (a step failed: a lost tensor- or pipeline-parallel rank, a device error) can
        serve nothing again: it exits at once rather than at Serve's next health check, so the ingress sees the
        replica lost (its streams end with an error event, its other requests and new ones go to another replica)
        and Serve starts a new one."""
        self.engine.died.wait()
        logger.error("model %s: the engine died (%r); this replica exits for Serve to replace it", self.model_id,
                     self.engine.error)
        logging.shutdown()  # flush the log first: os._exit skips it
        os._exit(1)

    # --- the ModelClient interface (clients.py): replies, or streams of chunks ---

    async def chat(self, req: ChatCompletionRequest, request_id: str | None = None, priority: int = 0,
                   owner: str | None = None) -> dict:
        self._serves("generate")
        with continued(req):
            return await _reply(self.chat_handler.complete(req, request_id or new_id("chatcmpl-"), priority, owner))

    async def completions(self, req: CompletionRequest, request_id: str | None = None, priority: int = 0,
                          owner: str | None = None) -> dict:
        self._serves("generate")
        with continued(req):
            return await _reply(self.completion_handler.complete(req, request_id or new_id("cmpl-"), priority, owner))

    async def prefill(self, req: ChatCompletionRequest | CompletionRequest, method: str) -> None:
        """A disaggregated request's prefill (deployments/disaggregated.py): its prompt computed here, returning once
        the shared tier's directory holds the prompt's blocks (or `PUBLISH_TIMEOUT_S` has passed: the decode
        replica then computes what it cannot fetch)."""
        await getattr(self, method)(req)
        tier = self.engine.engine.shared_tier
        if tier is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(tier.flush), PUBLISH_TIMEOUT_S)
            except TimeoutError:
                logger.warning("model %s: the prompt's blocks took over %s s to publish", self.model_id,
                               PUBLISH_TIMEOUT_S)

    async def generate(self, req: GenerateRequest, owner: str | None = None) -> dict | list:
        self._serves("generate")
        with continued(req):
            return await _reply(self.generate_handler.complete(req, owner=owner))

    async def embeddings(self, req: EmbeddingRequest, request_id: str | None = None, priority: int = 0,
                         owner: str | None = None) -> dict:
        self._serves("pooling")
        with continued(req):
            return await _reply(self.embedding_handler.embed(req, request_id or new_id("embd-"), priority, owner))

    async def pooling(self, req: PoolingCall, request_id: str | None = None, priority: int = 0,
                      owner: str | None = None) -> dict:
        self._serves("pooling")
        handle, prefix = self.pooling_routes[type(req)]
        with continued(req):
            return await _reply(handle(req, request_id or new_id(prefix), priority, owner))

    async def answer_lines(self, lines: list[tuple[object, str]], priority: int
                           ) -> AsyncIterator[list[tuple[int, int, dict]]]:
        """Batch lines the batch manager coalesced into one call, answered concurrently and streamed back as they
        finish: (index in `lines`, HTTP status, body) of each line done since the last item, an error as its
        OpenAI error body, as the line's output records it. Leaving early cancels the lines left."""
        calls = {ChatCompletionRequest: self.chat, CompletionRequest: self.completions,
                 EmbeddingRequest: self.embeddings, ScoreRequest: self.pooling, RerankRequest: self.pooling}

        async def answer(index: int, body, request_id: str) -> tuple[int, int, dict]:
            try:
                return index, 200, await calls[type(body)](body, request_id, priority)
            except OpenAIError as e:
                return index, e.status, e.body()

        pending = {asyncio.ensure_future(answer(i, body, request_id)) for i, (body, request_id) in enumerate(lines)}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                yield [task.result() for task in done]
        finally:
            for task in pending:
                task.cancel()

    async def tokenize(self, req: TokenizeRequest) -> dict:
        return await _reply(self.tokenize_handler.tokenize(req))

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        return await _reply(self.tokenize_handler.detokenize(req))

    async def chat_stream(self, req: ChatCompletionRequest, owner: str | None = None
                          ) -> AsyncIterator[dict | StreamError]:
        self._serves("generate")
        with continued(req):
            async for chunk in _stream(self.chat_handler.stream(req, new_id("chatcmpl-"), owner)):
                yield chunk

    async def completions_stream(self, req: CompletionRequest, owner: str | None = None
                                 ) -> AsyncIterator[dict | StreamError]:
        self._serves("generate")
        with continued(req):
            async for chunk in _stream(self.completion_handler.stream(req, new_id("cmpl-"), owner)):
                yield chunk

    async def generate_stream(self, req: GenerateRequest, owner: str | None = None
                              ) -> AsyncIterator[dict | StreamError]:
        self._serves("generate")
        with continued(req):
            async for chunk in _stream(self.generate_handler.stream(req, owner)):
                yield chunk

    def _serves(self, runner: str) -> None:
        """A 400 naming `model` unless this model serves the route's kind of request (runner)."""
        if self.engine.runner != runner:
            kind = "a pooling model (runner: pooling): it serves /v1/embeddings, /pooling, /score, /rerank and " \
                "/classify" if self.engine.runner == "pooling" else \
                "not a pooling model (engine_kwargs runner: pooling)"
            raise OpenAIError(400, f"model: {self.model_id!r} is {kind}", "model")

    # --- operations ------------------------------------------------------------

    async def check_health(self) -> None:
        """Serve's health check: a dead engine or TP worker marks the replica unhealthy; Serve replaces it."""
        if not await asyncio.to_thread(self.engine.check_health):
            raise RuntimeError(f"engine is not healthy: {self.engine.error!r}")

    async def healthy(self) -> bool:
        return self.engine.healthy

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's autoscaler reads of this replica (deployments/autoscaling.py): its recent TTFT and ITL p90."""
        return self.request_metrics.window.p90s(self.request_metrics.oldest_wait())

    async def record_routing_stats(self) -> dict:
        """What Serve hands the prefix-aware router of this replica (deployments/prefix_router.py): the route marks
        (deployments/route_marks.py) whose prefixes its engine holds, and when it said so."""
        if not self.engine.healthy:
            return {}
        return {"prefix_marks": await asyncio.to_thread(self.engine.engine.held_prefix_marks), "at": time.time()}

    async def max_model_len(self) -> int:
        return self.engine.max_model_len

    async def quantization(self) -> str | None:
        return self.engine.quantization

    async def architecture(self) -> str:
        return self.engine.architecture

    async def stats(self) -> dict:
        return {**self.engine.stats(), "rss_bytes": _rss_bytes(), "pid": os.getpid()}

    async def lifecycle(self, operation: str, *args) -> dict:
        """An engine lifecycle operation on this replica (runtime.engine.lifecycle); its state after it."""
        await _reply(self.engine.lifecycle(operation, *args))
        logger.info("model %s: %s%s done", self.model_id, operation, f" {args}" if args else "")
        return await self.lifecycle_state()

    async def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                backend: str) -> dict:
        """SGLang's init_weights_update_group, on every replica at once: replica k's ranks join as `rank_offset`
        plus k times its ranks (tensor times pipeline parallel size; plus the rank)."""
        ranks = self.engine.engine.config.world_size
        offset = rank_offset + serve.get_replica_context().rank.rank * ranks
        return await self.lifecycle("init_weights_update_group", master_address, master_port, offset, world_size,
                                    backend)

    async def check_adapter(self, name: str) -> None:
        """An adapter just loaded (vLLM's /v1/load_lora_adapter): fetched here and read by the engine, which
        refuses one it cannot run (a 400: a rank over max_lora_rank, a module it lacks)."""
        lora = await asyncio.to_thread(self.adapters.request_for, f"{self.model_id}:{name}")
        try:
            await asyncio.to_thread(self.engine.validate, [0], SamplingParams(max_tokens=1), lora)
        except InvalidInputError as e:
            raise OpenAIError(400, f"LoRA adapter {name!r}: {e}", "lora_path") from None

    async def forget_adapter(self, name: str) -> None:
        """An adapter unloaded: this replica's copy goes, and the engine loads the name afresh if it comes back."""
        await asyncio.to_thread(self.adapters.forget, name)
        await self.engine.lifecycle("unload_adapter", name)

    async def lifecycle_state(self) -> dict:
        stats = self.engine.stats()
        return {"paused": stats["paused"], "asleep": stats["asleep"], "kv_cache_bytes": stats["kv_cache_bytes"],
                "weight_version": stats["weight_version"], "ranks": self.engine.engine.config.world_size}

    async def on_every_replica(self, method: str, *args) -> list:
        """Direct streaming (this replica answers HTTP): `method` on every replica of this deployment."""
        context = serve.get_replica_context()
        return await on_every_replica(serve.get_deployment_handle(context.deployment, context.app_name), method, *args)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _to_openai(e: Exception) -> OpenAIError:
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ContextLengthError):  # OpenAI's code for it
        return OpenAIError(400, str(e), e.param, "context_length_exceeded", (e.prompt_tokens, e.max_tokens, e.limit))
    if isinstance(e, InvalidInputError):
        return OpenAIError(400, str(e), param=e.param)
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, str(e), code=ENGINE_DEAD)
    if isinstance(e, RequestFailedError):  # this request alone; the engine serves on
        return OpenAIError(500, f"the engine failed this request: {e}")
    logger.exception("request failed")
    return OpenAIError(500, f"internal error: {type(e).__name__}")


async def _reply(work):
    try:
        return await work
    except Exception as e:
        raise _to_openai(e) from None


async def _stream(prepare) -> AsyncIterator[dict | StreamError]:
    """The chunks of a prepared stream; a failure to prepare raises, a failure after the first chunk is
    the stream's last item."""
    try:
        chunks = await prepare
    except Exception as e:
        raise _to_openai(e) from None
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as e:  # the stream already started: report in-band, then end it
        yield StreamError.of(_to_openai(e))
