"""Requests and their sequences: the state the scheduler, block manager and runner share.

A request holds one prompt and `n` sequences, one per completion; each sequence
is scheduled on its own, and siblings share the prompt's cached blocks.
"""

import enum
import itertools
from operator import attrgetter

import torch

from runtime.lora.adapter import LoRAAdapter
from runtime.multimodal.inputs import ImageInput
from runtime.outputs import TokenLogprob
from runtime.pooling import PoolerConfig
from runtime.sampling_params import SamplingParams
from runtime.text.grammar import Grammar, Matcher

_arrivals = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        grammar: Grammar | None = None,
        adapter: LoRAAdapter | None = None,
        owner: str | None = None,
        pooling: PoolerConfig | None = None,
        stream: bool = True,
        images: tuple[ImageInput, ...] = (),
    ):
        self.request_id = request_id
        self.stream = stream  # False: its caller reads only its final text (engine.enqueue)
        self.owner = owner  # who sent it (an API key's digest, a tenant; None: anonymous): admission is fair by owner
        self.pooling = pooling  # an embedding request: its prompt is prefilled and pooled, nothing is sampled
        self.adapter = adapter  # the LoRA adapter it runs with; its name also keys its prefix-cache blocks
        self.prompt_token_ids = prompt_token_ids
        self.images = images  # the prompt's pictures, in order: their tokens' inputs come from the vision encoder
        self.rope_layout = None  # M-RoPE's positions of its pictures, once the model runner has read them
        self.prefix_marks: tuple[int, ...] = ()  # a router's labels for its prompt's prefixes (core.prefix_marks)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_tokens = params.max_tokens  # resolved against the context by the engine
        # what ends its sequences, set by the engine: these ids (EOS unless ignored, stop token ids), this length
        self.end_token_ids = frozenset(params.stop_token_ids)
        self.max_num_tokens = len(prompt_token_ids) + (params.max_tokens or 0)
        self.priority = priority  # lower runs first (0: online, larger: batch jobs)
        self.arrival = next(_arrivals)
        self.prompt_logprobs: list[TokenLogprob | None] = []
        # its next step needs the tokens on the host, not just on the device (a grammar, penalties): under async
        # scheduling the step waits for them
        self.needs_tokens_on_host = grammar is not None or params.uses_penalties
        self.seqs = [Sequence(self, i, grammar) for i in range(params.n)]

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def finished(self) -> bool:
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                return False
        return True

    @property
    def num_cached_tokens(self) -> int:
        return self.seqs[0].num_cached_tokens

    @property
    def samples(self) -> bool:
        """Whether its sequences sample tokens: not an embedding request, nor one with max_tokens 0, whose prompt
        is prefilled (and scored, when prompt logprobs are asked) and nothing more."""
        return self.pooling is None and self.max_tokens != 0

    @property
    def needs_every_prompt_position(self) -> bool:
        """Whether every prompt position must be computed (so no prefix-cache hit may stand in for one)."""
        return self.params.prompt_logprobs is not None or (self.pooling is not None and
                                                           self.pooling.pooling_type == "mean")


class Sequence:
    def __init__(self, request: Request, index: int, grammar: Grammar | None = None):
        self.request = request
        self.index = index
        self.params = request.params
        self.token_ids = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.order = (request.priority, request.arrival, index)  # scheduling order: priority, arrival, completion
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight = 0  # tokens a launched step samples that are not appended yet (async scheduling)
        self.num_cached_tokens: int | None = None  # prompt tokens hit at first admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.num_committed_blocks = 0
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.matched_stop: int | str | None = None
        self.matcher = Matcher(grammar) if grammar is not None else None  # structured output state
        self.lora_slot: int | None = None  # the adapter slot pinned while it runs
        self.state_slot: int | None = None  # its layers' state while it runs, in a model with stateful layers
        # the frequencies it is computed with, where the RoPE scales with length (`rotary.LengthScaledRope`)
        self.rope_scale = 0
        self.pooled: torch.Tensor | None = None  # an embedding request's pooled hidden states so far (float32 sum)
        self.draft_token_ids: list[int] = []  # speculative tokens the coming step verifies after its last token
        self.speculation = None  # runtime.speculative's per-sequence state, once it has speculated

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def arrival(self) -> int:
        return self.request.arrival

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens the coming step may compute: those appended but not computed, and those in flight."""
        return len(self.token_ids) + self.num_in_flight - self.num_computed_tokens

    @property
    def last_token_in_flight(self) -> bool:
        """Whether a token in flight is its last (max_tokens, the context): no step needs to follow it."""
        return self.num_in_flight > 0 and len(self.token_ids) + self.num_in_flight >= self.request.max_num_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


BY_ORDER = attrgetter("order")  # the key that sorts sequences in their scheduling order
