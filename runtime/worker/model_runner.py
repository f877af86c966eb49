"""Runs one scheduled batch through the model: flatten, forward, logits, sample.

The batch is flattened into one token stream (decodes first, then prefill
chunks); logits are computed only where a token is sampled, plus prompt
positions of requests that asked for prompt logprobs. Embedding requests'
final hidden states are summed over the rows they pool (their last prompt
token, or every prompt token of the chunk), and nothing is sampled for them.
"""

import torch

from kernels import AttentionMetadata, choose_attention_backend, tensor_on, to_device
from kernels.attention.pictures import PictureAttention, pictures_in_chunk
from runtime.config import KV_CACHE_DTYPES, EngineConfig
from runtime.core.scheduler import ScheduledBatch
from runtime.core.sequence import Request, Sequence
from runtime.distributed import (
    PipelineStage,
    all_reduce_min,
    broadcast_from_rank0,
    destroy_groups,
    init_groups,
    set_expert_parallel,
    set_pipeline_stage,
)
from runtime.errors import InvalidInputError, describe
from runtime.kv_tier.host_storage import HostKVTier
from runtime.layers.chunked_attention import ChunkedAttentionMetadata, chunked_view
from runtime.layers.rotary import LengthScaledRope
from runtime.layers.state_cache import StateStep, allocate_states, stateful_layers
from runtime.lora import load_into_slot
from runtime.models.spec import ModelSpec
from runtime.worker.encoder_cache import encoder_cache_of
from runtime.worker.gpu_budget import gpu_kv_budget
from runtime.worker.model_builder import build_model
from runtime.worker.pipeline import Pipeline
from runtime.worker.runner_weights import RunnerWeights, attention_layers
from runtime.worker.sampler import Sampler, draw_offsets, token_logprob
from runtime.worker.step import LaunchedStep, RunnerCall, StepInputs, StepResult
from runtime.worker.verifier import split_rows

_CPU_KV_BYTES = 2 << 30


class ModelRunner(RunnerWeights):
    """Owns one rank's model shard and KV cache. Rank 0 prepares each step, broadcasts it to the
    other ranks (when tensor- or pipeline-parallel), runs its share and samples."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, eos_token_ids: set[int], rank: int = 0,
                 address: str | None = None):
        self.config = config
        self.spec = spec
        self.rank = rank
        self.device = torch.device(config.device)
        self.kv_cache_dtype = KV_CACHE_DTYPES[config.kv_cache_dtype] or spec.dtype
        # chosen here, in the rank's own process: a worker whose machine cannot build the CPU kernel runs torch's
        try:
            self.attention_backend = choose_attention_backend(config.attention_backend, self.device.type, spec.dtype,
                                                              spec.head_dim, self.kv_cache_dtype)
        except ValueError as e:
            raise InvalidInputError("attention_backend", str(e)) from None
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        if config.world_size > 1:
            init_groups(rank, tp, pp, address, self.device.type)
        set_expert_parallel(config.enable_expert_parallel)
        stage = PipelineStage(rank // tp, pp, config.pp_layer_partition)
        set_pipeline_stage(stage)
        self.pipeline = None if pp == 1 else Pipeline(stage, spec.hf_config.hidden_size, spec.dtype, self.device)
        torch.manual_seed(config.seed)
        self.weights = spec.path  # the checkpoint the weights came from: waking up loads it again
        self.model, self.lora_batch = build_model(spec, config, self.device, spec.path)
        self.sampler = Sampler(eos_token_ids, self.device)
        self.use_graphs = (self.device.type == "cuda" and not config.enforce_eager and config.world_size == 1
                           and self.attention_backend.supports_cuda_graphs and not config.enable_lora
                           and self.model.lm_head is not None
                           and all(getattr(module, "cuda_graphs", True) for module in self.model.modules()))
        self.graphs = None
        self.scaled_rope = LengthScaledRope.of(spec.hf_config, spec.max_model_len)
        self.keep_hidden = False  # a multi-token-prediction proposer reads each step's hidden states (every row)
        self.hidden: torch.Tensor | None = None  # the last step's, when kept
        self.attention_layers = attention_layers(self.model)
        self.encoder_cache = encoder_cache_of(self.model, spec, self.device)
        self.num_blocks = self._allocate_kv_cache()
        self.kv_tier = None
        if config.kv_offloading_size:
            self.kv_tier = HostKVTier(int(config.kv_offloading_size * 2**30), self.kv_cache)
            if self.kv_tier.num_slots == 0:
                raise InvalidInputError("kv_offloading_size", f"{config.kv_offloading_size} GiB holds no KV block "
                                        f"({self.kv_tier.block_bytes} bytes)")
        self._attach_caches()

    def _attach_caches(self) -> None:
        """Point the model's attention layers at the KV cache, give its stateful layers their state pools, and
        capture the decode graphs over them."""
        self.attention_layers = attention_layers(self.model)
        planes = self.kv_cache.shape[0]
        for i, attention in enumerate(self.attention_layers):
            attention.k_cache = self.kv_cache[0, i]
            attention.v_cache = self.kv_cache[planes - 1, i]
        self.stateful_layers = stateful_layers(self.model)
        allocate_states(self.stateful_layers, self.config.max_num_seqs, self.device)
        if self.use_graphs:
            from runtime.worker.cuda_graphs import DecodeGraphs  # imports Triton, which a CPU machine may lack

            self.graphs = DecodeGraphs(self.model, self.config.max_num_seqs, self.spec.max_model_len,
                                       self.config.block_size, self.attention_backend, self.device)

    def _allocate_kv_cache(self) -> int:
        cfg, max_model_len, dtype = self.config, self.spec.max_model_len, self.kv_cache_dtype
        layers, planes, shape = len(self.attention_layers), self.kv_planes(), self.block_shape()
        bytes_per_block = planes * layers * shape[0] * shape[1] * shape[2] * dtype.itemsize
        self.kv_bytes_per_token = bytes_per_block // cfg.block_size
        budget = cfg.kv_cache_bytes
        if budget is None:  # enough for every sequence at full length, within what the device can give
            full = -(-cfg.max_num_seqs * max_model_len // cfg.block_size) * bytes_per_block
            budget = min(full, gpu_kv_budget(self, self.use_graphs) if self.device.type == "cuda" else _CPU_KV_BYTES)
        # every rank must agree on the pool; a pipeline stage of linear-attention layers only holds none of it
        num_blocks = all_reduce_min(max(0, budget) // bytes_per_block if bytes_per_block else 2**62)
        if num_blocks * cfg.block_size < max_model_len:
            raise InvalidInputError(
                "kv_cache_bytes" if cfg.kv_cache_bytes is not None or self.device.type == "cpu"
                else "gpu_memory_utilization",
                f"{budget} bytes hold {num_blocks * cfg.block_size} tokens, "
                f"fewer than max_model_len ({max_model_len}); raise the budget or lower max_model_len"
            )
        self.kv_cache = self.new_kv_cache(num_blocks)
        return num_blocks

    def new_kv_cache(self, num_blocks: int) -> torch.Tensor:
        """A zeroed KV cache of `num_blocks` blocks for the model's attention layers."""
        shape = (self.kv_planes(), len(self.attention_layers), num_blocks, *self.block_shape())
        return torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)

    def kv_planes(self) -> int:
        """2 (keys, values), or 1 where values are read from the keys (latent attention)."""
        return self.attention_layers[0].kv_planes if self.attention_layers else 2

    def block_shape(self) -> tuple[int, int, int]:
        """One KV-cache block of one layer: (block_size, this rank's KV heads, head size)."""
        heads = self.attention_layers[0].num_kv_heads if self.attention_layers else 0
        return self.config.block_size, heads, self.spec.head_dim

    def _tensors(self, inputs: StepInputs, previous_tokens: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's input ids and positions (rotary-table rows; M-RoPE's three axes where pictures' rows
        differ in them) on the device."""
        positions = torch.tensor(inputs.rope_rows or inputs.positions, dtype=torch.long)
        if inputs.spatial_positions:
            positions = positions.repeat(3, 1)
            for first, rows, columns in inputs.spatial_positions:
                positions[1, first : first + len(rows)] = torch.tensor(rows)
                positions[2, first : first + len(columns)] = torch.tensor(columns)
        return self._input_ids(inputs, previous_tokens), to_device(positions, self.device)

    def _input_ids(self, inputs: StepInputs, previous_tokens: torch.Tensor | None) -> torch.Tensor:
        """The step's input tokens on the device, those in flight copied from the previous step's tokens there
        (a row whose sampling failed, -1, reads token 0: its request has failed, its output is dropped)."""
        ids = tensor_on(inputs.input_ids, torch.long, self.device)
        if inputs.in_flight:
            rows, sources = zip(*inputs.in_flight)
            ids[tensor_on(rows, torch.long, self.device)] = \
                previous_tokens[tensor_on(sources, torch.long, self.device)].clamp(min=0)
        return ids

    # --- rank 0 --------------------------------------------------------------

    def run(self, batch: ScheduledBatch) -> StepResult:
        return self.collect(self.launch(batch))

    def launch(self, batch: ScheduledBatch, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Queue the step's forward pass and sampling; on a GPU, without waiting for them (or for `previous`,
        whose tokens still in flight this step's inputs read on the device)."""
        inputs, prompt_seqs, pool_seqs, prefilled = self.prepare(batch, previous)
        if self.config.world_size > 1:
            broadcast_from_rank0(inputs)
        logits, prompt_logits, pooled = self.execute(inputs, None if previous is None else previous.tokens)
        failed: dict[Request, str] = dict(self.encoder_cache.failed)
        seqs = batch.sampled
        rows = seqs if len(inputs.logit_rows) == len(seqs) else [  # a verified draft adds a row
            s for s in seqs for _ in range(1 + len(s.draft_token_ids))]
        tokens, raw_logprobs = self._sample(logits, rows, failed)
        step = LaunchedStep(seqs, rows, tokens, raw_logprobs,
                            [(seq, start, chunk) for (seq, start), chunk in zip(prompt_seqs, prompt_logits)],
                            dict(zip(pool_seqs, pooled)), failed, prefilled)
        if self.keep_hidden:
            firsts = [0]
            for n in inputs.query_lens[:-1]:
                firsts.append(firsts[-1] + n)
            step.hidden = self.hidden
            step.spans = [(seq, row, inputs.positions[row]) for seq, row in zip(batch.seqs, firsts)]
        return step

    def collect(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step; its tokens, logprobs and prompt logprobs on the host."""
        token_list = [] if step.tokens is None else step.tokens.tolist()
        logprobs = self.sampler.logprobs(token_list, step.raw_logprobs, step.rows)
        token_ids, logprobs = split_rows(step.sampled, token_list, logprobs)
        failed, prompt_logprobs = step.failed, {}
        for seq, start, chunk in step.prompt_logits:
            targets = seq.token_ids[start + 1 : start + 1 + chunk.shape[0]]
            try:
                rows = torch.log_softmax(chunk.float() / seq.params.prompt_logprobs_temperature, dim=-1)
                k = seq.params.prompt_logprobs
                prompt_logprobs[seq.request] = [token_logprob(rows[i], t, k) for i, t in enumerate(targets)]
            except Exception as e:
                failed[seq.request] = describe(e)
        return StepResult(token_ids, logprobs, prompt_logprobs, failed, step.pooled)

    def _sample(self, logits: torch.Tensor | None, seqs: list[Sequence], failed: dict[Request, str]):
        """The batch's tokens (on the device) in one pass; if that raises, row by row, so only the rows that
        raise fail (token -1). Every other row draws what the batched pass would (its uniform depends on its
        sequence and position alone)."""
        if not seqs:  # a step of embedding requests only
            return None, None
        try:
            return self.sampler.sample(logits, seqs)
        except Exception:  # some row's sampling raised: which, row by row
            return self._sample_rows(logits, seqs, failed)

    def _sample_rows(self, logits: torch.Tensor, seqs: list[Sequence], failed: dict[Request, str]):
        tokens, raw_logprobs = [], []
        for i, (seq, offset) in enumerate(zip(seqs, draw_offsets(seqs))):
            try:
                token, raw = self.sampler.sample(logits[i : i + 1], [seq], [offset])
                raw = None if raw is None else raw[0]
            except Exception as e:
                failed[seq.request] = describe(e)
                token, raw = torch.full((1,), -1, dtype=torch.long, device=logits.device), None
            tokens.append(token)
            raw_logprobs.append(raw)
        return torch.cat(tokens), raw_logprobs

    def prepare(self, batch: ScheduledBatch, previous: LaunchedStep | None = None
                ) -> tuple[StepInputs, list[tuple[Sequence, int]], list[Sequence], list[Sequence]]:
        """The step's inputs, the sequences (with their first position) whose prompt logprobs it computes, the
        embedding requests' sequences it pools rows of, and the sequences that sample nothing (max_tokens 0). A
        sequence's newest token may still be in flight: `previous` sampled it, and the forward pass reads it from
        there."""
        inputs = StepInputs([], [], [], [], [], batch.num_decodes, [], [], lora_loads=batch.lora_loads,
                            kv_moves=batch.kv_moves)
        prompt_seqs, pool_seqs, prefilled = [], [], []
        previous_rows = {} if previous is None else previous.row_of()
        input_ids, positions, logit_rows = inputs.input_ids, inputs.positions, inputs.logit_rows
        offset = 0
        image_chunks = []  # (request, start, end, first row) of prefill chunks of prompts with pictures
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            drafts, token_ids, request = seq.draft_token_ids, seq.token_ids, seq.request
            if request.images and start < request.images[-1].end:
                image_chunks.append((request, start, end, offset))
                if self.model.pictures_attend_both_ways:
                    inputs.picture_rows += pictures_in_chunk([(i.offset, i.end) for i in request.images], start, end,
                                                             offset, seq.block_table)
            if n == 1:  # the rule: a decode (one token a step has no drafts)
                if start < len(token_ids):
                    input_ids.append(token_ids[start])
                else:  # its newest token is the previous step's, in flight
                    inputs.in_flight.append((offset, previous_rows[seq]))
                    input_ids.append(0)
                positions.append(start)
            else:
                ids = token_ids[start:end]
                if end > len(token_ids) + len(drafts):  # its newest token is the previous step's, in flight
                    inputs.in_flight.append((offset + n - 1, previous_rows[seq]))
                    ids.append(0)
                input_ids.extend((ids + drafts)[:n] if drafts else ids)  # drafts follow its last token
                positions.extend(range(start, end))
            if self.scaled_rope is not None or self.model.multimodal_rope:
                self._rotary_rows(inputs, seq, offset, start, n)
            inputs.query_lens.append(n)
            inputs.context_lens.append(end)
            inputs.block_tables.append(seq.block_table)
            if self.lora_batch is not None:
                inputs.lora_slots.append(-1 if seq.lora_slot is None else seq.lora_slot)
            if self.stateful_layers:
                inputs.state_slots.append(seq.state_slot)
            pooling = request.pooling
            if pooling is not None:
                if pooling.pooling_type == "mean":
                    inputs.pool_spans.append((offset, n))
                    pool_seqs.append(seq)
                elif end == len(token_ids):
                    inputs.pool_spans.append((offset + n - 1, 1))
                    pool_seqs.append(seq)
            elif not request.samples:
                prefilled.append(seq)
            elif end == len(token_ids) + seq.num_in_flight + len(drafts):  # its chunk reaches its last token
                logit_rows.extend(range(offset + n - 1 - len(drafts), offset + n))
            if seq.params.prompt_logprobs is not None and seq.index == 0 and start < seq.num_prompt_tokens - 1:
                last = min(end, seq.num_prompt_tokens - 1)  # the position predicting the last prompt token
                inputs.prompt_spans.append((offset, last - start))
                prompt_seqs.append((seq, start))
            offset += n
        self._place_images(inputs, image_chunks)
        return inputs, prompt_seqs, pool_seqs, prefilled

    def _rotary_rows(self, inputs: StepInputs, seq: Sequence, offset: int, start: int, n: int) -> None:
        """The rotary tables' rows a sequence's tokens take where they are not their positions: a length-scaled
        RoPE's, or M-RoPE's (positions shifted past the prompt's pictures, and a picture's rows' three)."""
        if self.scaled_rope is not None:
            inputs.rope_rows.extend(self.scaled_rope.rows(seq.rope_scale, seq.num_prompt_tokens, start, n))
            return
        request = seq.request
        if not request.images:
            inputs.rope_rows.extend(range(start, start + n))
            return
        if request.rope_layout is None:
            request.rope_layout = self.model.rope_layout(request.images)
        times, rows, columns = request.rope_layout.positions(start, start + n)
        inputs.rope_rows.extend(times)
        if times != rows or times != columns:
            inputs.spatial_positions.append((offset, rows, columns))

    def _place_images(self, inputs: StepInputs, chunks: list[tuple[Request, int, int, int]]) -> None:
        """The step's picture rows and their encoder outputs (encoded now where the cache lacks them)."""
        inputs.image_rows, embeds = self.encoder_cache.rows(chunks)
        if embeds is not None and self.config.world_size > 1:
            embeds = embeds.cpu()  # travels to the other ranks with the step's inputs
        inputs.image_embeds = embeds

    def shutdown(self) -> None:
        """Release the workers and leave the process group, even when a worker is already gone."""
        if self.config.world_size > 1:
            try:
                broadcast_from_rank0(None)
            except Exception:  # a dead worker cannot be told; leaving the group is what matters
                pass
            finally:
                destroy_groups()

    # --- every rank ------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, inputs: StepInputs, previous_tokens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """The forward pass, the logits rank 0 needs (the LM head is a collective, so all the first stage's ranks
        run it; None when nothing is sampled) and the sums of the pooled hidden states (a classifier's logits of
        them; after the all-reduce, every rank holds them whole); nothing on a later pipeline stage.
        `previous_tokens`: the previous step's sampled tokens, which `inputs.in_flight` reads."""
        if inputs.kv_moves:
            self.kv_tier.apply(inputs.kv_moves, self.kv_cache)
        if self.lora_batch is not None:
            for slot, adapter in inputs.lora_loads:
                load_into_slot(self.model, slot, adapter)
        if self.graphs is not None and not self.keep_hidden and inputs.one_sampled_row_each and self.graphs.fits(
                len(inputs.query_lens), inputs.num_decodes, max(map(len, inputs.block_tables))):
            return self.graphs.run(self._input_ids(inputs, previous_tokens), inputs.positions, inputs.context_lens,
                                   inputs.block_tables, self.config.block_size), [], []
        hidden = self.forward(inputs, previous_tokens)
        if hidden is None:  # a later pipeline stage: its part is done
            return None, [], []
        self.hidden = hidden if self.keep_hidden else None
        logits = self.model.compute_logits(hidden[inputs.logit_rows]) if inputs.logit_rows else None
        prompt_logits = [self.model.compute_logits(hidden[first : first + count])
                         for first, count in inputs.prompt_spans]
        pooled = [self.model.pool_head(hidden[first : first + count].float().sum(0))
                  for first, count in inputs.pool_spans]
        return logits, prompt_logits, pooled

    def forward(self, inputs: StepInputs, previous_tokens: torch.Tensor | None = None) -> torch.Tensor | None:
        """The model's final hidden states for the step's tokens (None on a pipeline stage after the first)."""
        if self.pipeline is not None:
            return self.pipeline.run(inputs, self._stage_forward)
        return self._stage_forward(inputs, None, previous_tokens)

    def _stage_forward(self, inputs: StepInputs, carried: tuple | None, previous_tokens: torch.Tensor | None = None):
        """This rank's layers on `inputs` (the step, or a pipeline micro-batch of it)."""
        if self.lora_batch is not None:
            self.lora_batch.set(inputs.lora_slots, inputs.query_lens, self.device)
        if self.stateful_layers:
            step = StateStep.build(inputs.state_slots, inputs.query_lens, inputs.context_lens, self.device)
            for layer in self.stateful_layers:
                layer.step = step
        images = {}
        if inputs.image_rows:
            images["images"] = (inputs.image_rows, inputs.image_embeds.to(self.device))
        return self.model(*self._tensors(inputs, previous_tokens), self.attention_metadata(inputs), carried, **images)

    def attention_metadata(self, inputs: StepInputs) -> AttentionMetadata | ChunkedAttentionMetadata:
        """The step's attention metadata; for a model with chunked layers, theirs beside it."""
        block_size, backend = self.config.block_size, self.attention_backend
        meta = backend.build_metadata(inputs.query_lens, inputs.context_lens, inputs.block_tables, block_size,
                                      inputs.num_decodes, self.device)
        if inputs.picture_rows:
            meta.pictures = PictureAttention(inputs.picture_rows, block_size, self.device)
        chunk = self.model.attention_chunk_size
        if chunk is None:
            return meta
        pieces = chunked_view(inputs.query_lens, inputs.context_lens, inputs.block_tables, chunk, block_size)
        return ChunkedAttentionMetadata(meta, backend.build_metadata(*pieces, block_size, inputs.num_decodes,
                                                                     self.device))

    def serve_rank0(self) -> None:
        """A worker rank's loop: run every step (or call) rank 0 broadcasts, until it sends None."""
        while (inputs := broadcast_from_rank0()) is not None:
            if isinstance(inputs, RunnerCall):
                getattr(self, inputs.name)(*inputs.args)
            else:
                self.execute(inputs)
        destroy_groups()
