"""What a step carries between the engine and the model runner: the inputs every rank runs (`StepInputs`), a step
launched on the device (`LaunchedStep`), and what it gave once collected (`StepResult`); and what rank 0 has the
other ranks run between steps (`RunnerCall`)."""

from dataclasses import dataclass, field

import torch

from kernels.attention.pictures import PictureRows
from runtime.core.sequence import Request, Sequence
from runtime.kv_tier.index import KVMove
from runtime.lora import LoRAAdapter
from runtime.outputs import TokenLogprob


@dataclass
class StepResult:
    # per sampled sequence, in `batch.sampled` order: the tokens it gains (one, or its accepted draft tokens and
    # one more) and their logprobs; [-1] where its request failed
    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprob | None]]
    prompt_logprobs: dict[Request, list[TokenLogprob]]  # logprobs of prompt tokens computed this step
    failed: dict[Request, str]  # requests whose sampling or prompt logprobs raised: why
    pooled: dict[Sequence, torch.Tensor] = field(default_factory=dict)  # embedding requests' sums of pooled rows


@dataclass
class LaunchedStep:
    """A step whose forward pass and sampling are queued on the device (`ModelRunner.launch`); its tokens stay
    there, where the next step can read them, until `ModelRunner.collect` brings them to the host."""

    sampled: list[Sequence]  # `batch.sampled`: the sequences it samples for
    rows: list[Sequence]  # the sequence of each sampled row (a verified draft adds a row)
    tokens: torch.Tensor | None  # each row's token, on the device (-1 where sampling failed); None: no rows
    raw_logprobs: torch.Tensor | list | None  # what `Sampler.logprobs` reads, per row
    prompt_logits: list[tuple[Sequence, int, torch.Tensor]]  # (sequence, first position, logits) of prompt spans
    pooled: dict[Sequence, torch.Tensor]
    failed: dict[Request, str]
    prefilled: list[Sequence]  # sequences of requests that sample nothing (max_tokens 0): they end with their prompt
    # with `ModelRunner.keep_hidden`: the final hidden states of every row, and each sequence's (first row, first
    # position) among them
    hidden: torch.Tensor | None = None
    spans: list[tuple[Sequence, int, int]] = field(default_factory=list)
    needs_tokens_on_host: bool = False  # a sequence's next step needs its tokens on the host (Request's flag)

    def row_of(self) -> dict[Sequence, int]:
        """Each sampled sequence's (first) row."""
        if len(self.rows) == len(self.sampled):  # no drafts: a row each
            return dict(zip(self.rows, range(len(self.rows))))
        rows = {}
        for i, seq in enumerate(self.rows):
            rows.setdefault(seq, i)
        return rows


@dataclass
class StepInputs:
    """Everything every rank needs to run one forward pass (plain lists: cheap to broadcast)."""

    input_ids: list[int]
    positions: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    num_decodes: int
    logit_rows: list[int]  # rows of the flattened batch whose logits are sampled from
    prompt_spans: list[tuple[int, int]]  # (first row, count) of prompt positions needing logprobs
    lora_slots: list[int] = field(default_factory=list)  # each sequence's adapter slot (-1: none), with LoRA
    state_slots: list[int] = field(default_factory=list)  # each sequence's state slot, for stateful layers
    # a model whose RoPE scales with length, past its original context: each token's rotary-table row
    # (`runtime.layers.rotary`)
    rope_rows: list[int] = field(default_factory=list)
    lora_loads: list[tuple[int, LoRAAdapter]] = field(default_factory=list)  # applied before the forward
    kv_moves: list[KVMove] = field(default_factory=list)  # copies between the KV pool and its tier, made first
    pool_spans: list[tuple[int, int]] = field(default_factory=list)  # (first row, count) of hidden states pooled
    # (row, row of the previous step's tokens) of input tokens still on the device (async scheduling; rank 0 only)
    in_flight: list[tuple[int, int]] = field(default_factory=list)
    # rows whose input is a picture's encoder output instead of its placeholder token's embedding, and those outputs
    # (`runtime.worker.encoder_cache`, on rank 0; sent to the other ranks with the rest)
    image_rows: list[int] = field(default_factory=list)
    image_embeds: torch.Tensor | None = None
    # pictures whose tokens attend both ways (`runtime.models.decoder.CausalLM.pictures_attend_both_ways`)
    picture_rows: list[PictureRows] = field(default_factory=list)
    # M-RoPE: (first row, row positions, column positions) of rows whose three positions differ (a picture's; the
    # time positions are `rope_rows`)
    spatial_positions: list[tuple[int, list[int], list[int]]] = field(default_factory=list)

    @property
    def one_sampled_row_each(self) -> bool:
        """Whether the step's only outputs are one sampled logit row per sequence, in order (what a decode graph
        computes): no prompt logprobs, no pooled states, no sequence that samples nothing."""
        return not (self.prompt_spans or self.pool_spans) and self.logit_rows == list(range(len(self.query_lens)))


@dataclass
class RunnerCall:
    """A method rank 0 has every other rank run between two steps (new weights, sleep, wake up)."""

    name: str
    args: tuple = ()
