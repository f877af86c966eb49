"""A draft model: a smaller checkpoint with the target's vocabulary proposes its greedy tokens.

Its KV cache has as many blocks as the target's, of the same size, so a sequence's draft keys and values
live in the blocks of the target's block table: whatever the target holds, frees or rolls back, the draft
follows, and it runs only for the sequences that propose. Each step it first catches up on the tokens it has
not seen (the whole prompt at first, then the last accepted tokens) and proposes its first token from that
chunk, then one token per decode step. Its argmax is a point mass, which the verifier checks exactly.
"""

from dataclasses import replace

import torch

from runtime.config import KV_CACHE_DTYPES, EngineConfig
from runtime.core.sequence import Sequence
from runtime.errors import InvalidInputError
from runtime.models.spec import ModelSpec
from runtime.text.tokenizer import load_tokenizer
from runtime.worker.model_runner import ModelRunner
from runtime.worker.step import StepInputs

_FIELD = "speculative_config.model"


class DraftModelProposer:
    def __init__(self, config: EngineConfig, spec: ModelSpec, tokenizer, eos_token_ids: set[int], num_blocks: int):
        name = config.speculative_config.model
        draft = replace(config, model=name, tokenizer=None, speculative_config=None, enable_lora=False,
                        max_model_len=spec.max_model_len, runner="generate")
        try:
            draft_spec = ModelSpec.resolve(draft)
        except InvalidInputError as e:
            raise InvalidInputError(_FIELD, f"the draft model {name}: {e}") from None
        _check_vocabulary(name, draft_spec, spec, tokenizer)
        hf = draft_spec.hf_config
        cache_dtype = KV_CACHE_DTYPES[config.kv_cache_dtype] or draft_spec.dtype  # the target's choice
        block_bytes = (2 * hf.num_hidden_layers * config.block_size * hf.num_key_value_heads * draft_spec.head_dim
                       * cache_dtype.itemsize)
        self.runner = ModelRunner(replace(draft, kv_cache_bytes=num_blocks * block_bytes), draft_spec, eos_token_ids)
        assert self.runner.num_blocks == num_blocks, (self.runner.num_blocks, num_blocks)

    def propose(self, seq: Sequence, state, k: int) -> list[int]:
        """`k` slots, filled by `complete` once the step is scheduled (and the slots' blocks exist)."""
        return [-1] * k

    def observe(self, step) -> None:
        """Nothing to learn from a step: the draft catches up on tokens when it next proposes."""

    @torch.inference_mode()
    def complete(self, seqs: list[Sequence]) -> None:
        chunks = []
        for seq in seqs:
            start = min(seq.speculation.draft_valid, seq.num_tokens - 1)
            chunks.append((seq, seq.token_ids[start:], start))
        for i in range(max((len(s.draft_token_ids) for s in seqs), default=0)):
            tokens = self._forward(chunks)
            for (seq, _, _), token in zip(chunks, tokens):
                seq.draft_token_ids[i] = token
            chunks = [(seq, [token], start + len(ids)) for (seq, ids, start), token in zip(chunks, tokens)
                      if len(seq.draft_token_ids) > i + 1]
        for seq in seqs:
            seq.speculation.draft_valid = seq.num_tokens + len(seq.draft_token_ids) - 1

    def _forward(self, chunks: list[tuple[Sequence, list[int], int]]) -> list[int]:
        """The draft's argmax after each chunk (token ids from its start position), in `chunks`' order."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i][1]) != 1)  # decodes first
        inputs = StepInputs([], [], [], [], [], 0, [], [])
        for i in order:
            seq, ids, start = chunks[i]
            inputs.input_ids.extend(ids)
            inputs.positions.extend(range(start, start + len(ids)))
            inputs.query_lens.append(len(ids))
            inputs.context_lens.append(start + len(ids))
            inputs.block_tables.append(seq.block_table)
            inputs.num_decodes += len(ids) == 1
            inputs.logit_rows.append(len(inputs.input_ids) - 1)
        logits, _, _ = self.runner.execute(inputs)
        tokens = logits.argmax(dim=-1).tolist()
        by_chunk = [0] * len(chunks)
        for row, i in enumerate(order):
            by_chunk[i] = tokens[row]
        return by_chunk


def _check_vocabulary(name: str, draft: ModelSpec, target: ModelSpec, tokenizer) -> None:
    if draft.vocab_size != target.vocab_size:
        raise InvalidInputError(_FIELD, f"the draft model {name} has a vocabulary of {draft.vocab_size} tokens and "
                                f"the target {target.vocab_size}: a draft must share the target's tokenizer")
    if load_tokenizer(draft.tokenizer).get_vocab() != tokenizer.get_vocab():
        raise InvalidInputError(_FIELD, f"the draft model {name}'s tokenizer maps tokens to other ids than the "
                                "target's: a draft must share the target's tokenizer")
