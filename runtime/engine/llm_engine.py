"""The synchronous engine: add requests, abort them, and step the batch forward.

`step_tokens()` schedules one batch, runs it, and post-processes the sampled
tokens into per-request deltas (new tokens, logprobs, finish reason), ending
sequences by token id and length (runtime.engine.post_process); `step()` also
gives them their text and ends sequences at stop strings
(runtime.engine.text_stage), which a caller may do on a thread of its own instead, as
AsyncLLMEngine does. An embedding request (`validate_embedding`)
is prefilled in the same batches and finishes with its pooled embedding once its
last prompt token is computed. A failure that belongs to one request (its
sampling, prompt logprobs, text or stop handling) finishes that request with an
error; the step goes on for the others.
"""

import logging
from functools import partial

from runtime.config import EngineConfig
from runtime.core.block_manager import FREED, BlockManager
from runtime.core.scheduler import ScheduledBatch, Scheduler
from runtime.core.sequence import Request, Sequence
from runtime.distributed import destroy_groups, free_address
from runtime.engine.lifecycle import EngineLifecycle
from runtime.engine.post_process import PostProcessor
from runtime.engine.text_stage import TextStage
from runtime.engine.validator import RequestValidator, ValidRequest
from runtime.engine.warm_up import warm_up
from runtime.errors import InvalidInputError
from runtime.kv_tier.host_storage import read_blocks
from runtime.kv_tier.index import TierIndex
from runtime.layers.rotary import LengthScaledRope
from runtime.layers.sliding_window import kv_window
from runtime.lora import AdapterSlots, LoRARequest
from runtime.multimodal import ImageInput
from runtime.outputs import RequestDelta
from runtime.sampling_params import SamplingParams
from runtime.speculative.build import build_speculator
from runtime.worker.model_runner import ModelRunner
from runtime.worker.step import LaunchedStep

logger = logging.getLogger(__name__)


class LLMEngine(EngineLifecycle):
    def __init__(self, config: EngineConfig, isolate_grammars: bool = True):
        self.config = config
        self.validator = RequestValidator(config, isolate_grammars)
        self.spec, self.tokenizer = self.validator.spec, self.validator.tokenizer
        self.eos_token_ids = self.validator.eos_token_ids
        stateful = self.spec.model_class.has_recurrent_state
        if config.kv_offloading_size is not None and (stateful or not config.enable_prefix_caching):
            raise InvalidInputError("kv_offloading_size", "holds prefix blocks: it needs enable_prefix_caching and "
                                    "a model whose layers keep no state per sequence")
        self.workers = None
        address = None
        if config.world_size > 1:
            from runtime.worker.rank_workers import RankWorkers  # the one place the engine uses Ray

            address = free_address()
            self.workers = RankWorkers(config, self.spec, self.eos_token_ids, address)
        try:
            self.runner = ModelRunner(config, self.spec, self.eos_token_ids, 0, address)
        except BaseException:
            if self.workers is not None:  # leave no worker or process group behind
                self.workers.shutdown(wait=False)
                destroy_groups()
            raise
        if stateful and config.enable_prefix_caching:
            logger.info("prefix caching is off for %s: its linear-attention layers keep a state per sequence, "
                        "which cached KV blocks cannot restore", self.spec.model_class.__name__)
        tier = TierIndex(self.runner.kv_tier.num_slots) if self.runner.kv_tier is not None else None
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching and not stateful,
                                          kv_window(self.spec.hf_config, self.spec.max_model_len),
                                          share_prefixes=not stateful, tier=tier,
                                          weights_version=self.spec.weights_version)
        self.adapter_slots = AdapterSlots(config.max_loras) if config.enable_lora else None
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.adapter_slots, config.max_num_seqs_per_owner, config.max_num_seqs_background,
                                   state_slots=stateful, whole_pictures=self.spec.pictures_attend_both_ways,
                                   scaled_rope=LengthScaledRope.of(self.spec.hf_config, self.spec.max_model_len))
        self.speculator = build_speculator(config, self.spec, self.tokenizer, self.eos_token_ids, self.runner)
        self.requests: dict[str, Request] = {}
        self.post = PostProcessor(self.scheduler, self.requests, self.runner.encoder_cache, self.speculator)
        self.shared_tier = None
        if config.kv_shared_tier is not None:
            from runtime.kv_tier.shared import SharedTier  # Ray, where the engine shares blocks

            self.shared_tier = SharedTier(config.kv_shared_tier, str(self.spec.path), self.block_manager,
                                          self.runner.kv_tier.block_bytes)
        self.text = TextStage(self.tokenizer)
        self._launched: LaunchedStep | None = None  # async scheduling: the batch whose tokens are still in flight
        if config.warm_up and config.runner == "generate":
            warm_up(self)

    @classmethod
    def from_options(cls, model: str, **engine_kwargs) -> "LLMEngine":
        return cls(EngineConfig(model=model, **engine_kwargs))

    # --- requests -----------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0, lora: LoRARequest | None = None, owner: str | None = None,
                    stream: bool = True, images: tuple[ImageInput, ...] = ()) -> None:
        """Validate a request and queue it (with the blocks of its prompt that the shared tier has, if any).
        `images`: its pictures' inputs, as `validator.process_images` made them with the prompt's token ids."""
        valid = self.validator.validate(prompt_token_ids, params, lora, images)
        if self.shared_tier is not None:
            self.import_blocks(self.fetch_shared(valid))
        self.enqueue(request_id, valid, priority, owner, stream)

    def fetch_shared(self, valid: ValidRequest):
        """The blocks of `valid`'s prompt that the shared tier has and this engine lacks (any thread may ask)."""
        return self.shared_tier.fetch(valid.prompt_token_ids, valid.adapter_name, valid.images,
                                      valid.params.cache_salt)

    def cached_prompt_tokens(self, valid: ValidRequest) -> int:
        """How many of `valid`'s prompt tokens the pool or the offload tier holds now, in whole blocks from the first
        (any thread may ask; they may be gone by the time the request is admitted)."""
        blocks = self.block_manager
        if not (blocks.enable_prefix_caching and blocks.share_prefixes):
            return 0
        hashes, tokens = blocks.prompt_hashes(valid.prompt_token_ids, valid.adapter_name, valid.images,
                                              valid.params.cache_salt)
        return blocks.held_prefix(hashes, tokens) * blocks.block_size

    def held_prefix_marks(self) -> list[int]:
        """The prefix marks of recent requests whose prefixes the pool or the offload tier holds (any thread may
        ask)."""
        return self.block_manager.held_marks()

    def import_blocks(self, fetched) -> None:  # blocks from the shared tier, into the offload tier
        if fetched is not None:
            fetched.place(self.block_manager, self.runner.kv_tier)

    def enqueue(self, request_id: str, valid: ValidRequest, priority: int = 0, owner: str | None = None,
                stream: bool = True) -> None:
        """Queue a validated request. A constrained request's grammar is compiled here unless it comes compiled.
        `owner` (an API key's digest, a tenant; None: anonymous) is who admission shares the engine fairly among.
        `stream` False: the caller reads only the final text, so the deltas before a sequence's last carry its
        tokens and no text (which its last one carries whole), and it is detokenized once (runtime.text.detokenizer)."""
        if request_id in self.requests:
            raise InvalidInputError("request_id", f"{request_id!r} is already in flight")
        prompt, params, grammar = valid.prompt_token_ids, valid.params, valid.grammar
        if params.structured_output is not None and grammar is None:
            grammar = self.validator.compile_grammar(params.structured_output)
        request = Request(request_id, prompt, params, priority, grammar, valid.adapter, owner, valid.pooling, stream,
                          valid.images)
        request.max_tokens = valid.max_tokens
        request.prefix_marks = valid.prefix_marks
        request.max_num_tokens = min(len(prompt) + valid.max_tokens, self.spec.max_model_len)
        if not params.ignore_eos:
            request.end_token_ids |= self.eos_token_ids
        self.text.start(request_id, prompt, None if valid.pooling else params, stream)
        self.requests[request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        self.text.forget(request_id)
        if request is None:
            return
        self.runner.encoder_cache.release(request)
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def healthy(self) -> bool:
        """False once a tensor-parallel worker has died or left."""
        return self.workers is None or self.workers.alive()

    def shutdown(self) -> None:
        """Stop the grammar compile processes and the tensor-parallel workers, if any; the engine is unusable
        afterwards."""
        self.validator.close()
        if self.shared_tier is not None:
            self.shared_tier.shutdown()
        if self.workers is not None:
            self.runner.shutdown()
            self.workers.shutdown()
            self.workers = None

    # --- stepping -----------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """`step_tokens()`, as deltas with their text (runtime.engine.text_stage)."""
        return self.text.apply(self.step_tokens())

    def step_tokens(self) -> list:
        """Retire the sequences the text stage ended, schedule and run one batch; what the batch whose tokens came
        back gained, without text: `TokenRecord`s and deltas (runtime.outputs), which the text stage takes.

        With `async_scheduling`, the batch is launched before the previous one's tokens are read (on a GPU, the
        host schedules, prepares and post-processes while the device computes): its sequences' newest tokens
        are read on the device, and the deltas returned are the previous batch's. A batch whose sequences need
        those tokens on the host first (a grammar, penalties) waits for them: the step runs as without. Paused or
        asleep (runtime.engine.lifecycle), it runs nothing.
        """
        retired = self._retire_ended_by_text()
        if self.paused or self.asleep:
            return retired
        previous, self._launched = self._launched, None
        deltas = []
        if previous is not None and previous.needs_tokens_on_host:
            deltas, previous = self._complete(previous), None
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        launched = self._launch(batch, previous) if batch else None
        if previous is not None:
            deltas = self._complete(previous)
        if launched is not None and not self.config.async_scheduling:
            deltas = self._complete(launched)
        else:
            self._launched = launched
        return retired + deltas if retired else deltas

    def _retire_ended_by_text(self) -> list[RequestDelta]:
        """Finish the sequences the text stage ended (a stop string, a failure); their deltas, which it drops."""
        deltas = []
        for request_id, index, reason in self.text.take_verdicts():
            request = self.requests.get(request_id)
            if request is None:
                continue
            delta = self.post.end_unfinished(request, reason, None if index is None else [request.seqs[index]])
            delta.finished = request.finished
            if delta.finished:
                del self.requests[request_id]
            deltas.append(delta)
        return deltas

    def _launch(self, batch: ScheduledBatch, previous: LaunchedStep | None) -> LaunchedStep:
        if self.speculator is not None:
            self.speculator.scheduled(batch.seqs)
        launched = self.runner.launch(batch, previous)
        for seq, total in launched.pooled.items():  # a sum restarts with the prompt (after a preemption, say)
            seq.pooled = total if seq.pooled is None or seq.num_computed_tokens == 0 else seq.pooled + total
        publishing = self.shared_tier is not None
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            before = seq.num_computed_tokens
            # draft tokens count once verified (`_verified`)
            seq.num_computed_tokens += n - len(seq.draft_token_ids) if seq.draft_token_ids else n
            if publishing and before < seq.num_prompt_tokens <= seq.num_computed_tokens and not launched.failed:
                self._publish(seq)
        needs_tokens_on_host = False
        for seq in launched.sampled:
            seq.num_in_flight += 1
            needs_tokens_on_host = needs_tokens_on_host or seq.request.needs_tokens_on_host
        launched.needs_tokens_on_host = needs_tokens_on_host
        return launched

    def _complete(self, launched: LaunchedStep) -> list:
        """Read a launched batch's tokens and post-process them (runtime.engine.post_process)."""
        return self.post.complete(launched, self.runner.collect(launched))

    def _publish(self, seq: Sequence) -> None:
        """`seq`'s prompt is computed: its full blocks go to the shared tier (its first completion's only)."""
        if seq.index == 0 and FREED not in seq.block_table:  # the sequence's own hashes: a scaled RoPE's included
            self.shared_tier.publish(seq.request.prompt_token_ids, partial(self.block_manager.prefix_hashes, seq),
                                     partial(read_blocks, self.runner.kv_cache), seq.block_table)

    # --- introspection ------------------------------------------------------

    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": self.scheduler.num_waiting,
            "num_requests": len(self.requests),
            "num_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks, "num_pinned_blocks": bm.num_pinned_blocks,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_hit_tokens": bm.hit_tokens,
            "prefix_cache_queried_tokens": bm.queried_tokens,
            "lora_adapters_loaded": [n for n in self.adapter_slots.names if n] if self.adapter_slots else [],
            "paused": self.paused, "asleep": self.asleep,
            "weight_version": bm.weights_version,
            "kv_cache_bytes": self.runner.kv_cache_bytes,
            **self.runner.encoder_cache.stats(),
            **(bm.tier.stats(self.runner.kv_tier.block_bytes) if bm.tier is not None else {}),
            **(self.shared_tier.stats() if self.shared_tier else {}),
            **(self.speculator.stats() if self.speculator is not None else {}),
        }
