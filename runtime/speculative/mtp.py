"""Multi-token prediction (DeepSeek-V3 and Kimi K2, GLM-4.5): the prediction layer the checkpoint saves after its
last decoder layer proposes draft tokens from the target's own hidden states.

At position i the layer reads the target's final hidden state there and the embedding of token i + 1, and
predicts token i + 2. It keeps its own KV cache (one layer in the target's block layout: a sequence's keys live in
the blocks of its block table, so whatever the target holds, frees or rolls back, it follows), and after every step
it catches up on every position the target computed and kept that step, while the target's hidden states for them
are at hand (`observe`). Once a sequence is caught up to its newest token, its output there is the first draft of
the sequence's next step; further drafts feed the layer its own output in place of the target's hidden state
(`complete`), at positions the next catch-up overwrites with the target's. Like every proposal here, the drafts
are a point mass the verifier checks exactly.

Where two sequences share a prefix-cached block, the block's last position holds the prediction-layer keys of the
sequence that computed it (they depend on the next token, which may differ): that can lower acceptance, never
change a token.
"""

import torch
from torch import nn

from kernels import tensor_on
from runtime.core.sequence import Sequence
from runtime.errors import InvalidInputError
from runtime.layers.linear import ParallelLMHead, ReplicatedLinear, VocabParallelEmbedding
from runtime.layers.norms import RMSNorm
from runtime.models import CausalLM, load_weights, pack_linear_weights
from runtime.models.loader import tensor_names
from runtime.models.spec import ModelSpec
from runtime.speculative.speculator import SequenceSpeculation
from runtime.worker.model_runner import ModelRunner
from runtime.worker.step import LaunchedStep

_FIELD = "speculative_config.method"


class MultiTokenPredictor(nn.Module):
    """The prediction layer, its parameters named as the checkpoint names them (`model.layers.<N>.`): the
    family's decoder layer (DeepSeek's latent attention and experts) with the norms of the embedding (`enorm`) and
    of the target's hidden state (`hnorm`), their projection back to the hidden size (`eh_proj`), and a head
    (`shared_head`); the embedding and head are the target's where the checkpoint has no copies of its own."""

    # loaded as the causal LM's checkpoint is (runtime/models/loader.py)
    bare_names = False
    tie_word_embeddings = False
    checkpoint_tensors = CausalLM.checkpoint_tensors

    def __init__(self, target: CausalLM, config, names: set[str]):
        super().__init__()
        self.index = config.num_hidden_layers
        self.prefix = f"model.layers.{self.index}."
        hidden, eps = config.hidden_size, config.rms_norm_eps
        layer = target.make_layer(config, target.make_attention(config, None, self.index),
                                  target.make_mlp(config, self.index))
        layer.enorm, layer.hnorm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        layer.eh_proj = ReplicatedLinear(2 * hidden, hidden, bias=False)
        layer.shared_head = nn.Module()
        layer.shared_head.norm = RMSNorm(hidden, eps)
        own_embedding = f"{self.prefix}embed_tokens.weight" in names
        own_head = f"{self.prefix}shared_head.head.weight" in names
        if own_embedding:
            layer.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden)
        if own_head:
            layer.shared_head.head = ParallelLMHead(config.vocab_size, hidden)
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(self.index): layer})
        # the target's parts, held outside the module tree (they are loaded with the target)
        self._target_parts = (layer.embed_tokens if own_embedding else target.model.embed_tokens,
                              layer.shared_head.head if own_head else target.lm_head,
                              target.model.rotary[target.model.rope_keys[-1]])
        self._family_param_for = target.param_for

    @property
    def layer(self) -> nn.Module:
        return self.model.layers[str(self.index)]

    def param_for(self, name: str) -> tuple[str | None, tuple]:
        """The prediction layer's tensors as the family maps a decoder layer's (fused projections, experts); the
        target's own tensors are passed over."""
        if not name.startswith(self.prefix):
            return None, ()
        target, shard = self._family_param_for(name.replace(self.prefix, "model.layers.0.", 1))
        return target.replace("model.layers.0.", self.prefix, 1), shard

    def forward(self, next_tokens: torch.Tensor, positions: torch.Tensor, target_hidden: torch.Tensor, meta
                ) -> torch.Tensor:
        """Its output at each position from the next token there and the target's hidden state."""
        embed, _, rotary = self._target_parts
        layer = self.layer
        x = layer.eh_proj(torch.cat([layer.enorm(embed(next_tokens)), layer.hnorm(target_hidden)], dim=-1))
        out, residual = layer(x, None, rotary(positions), meta)
        return out + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target_parts[1](self.layer.shared_head.norm(hidden))


class MtpProposer:
    def __init__(self, runner: ModelRunner, spec: ModelSpec):
        config = spec.hf_config
        names = tensor_names(runner.model, spec.path)
        if f"model.layers.{config.num_hidden_layers}.eh_proj.weight" not in names:
            raise InvalidInputError(_FIELD, f"mtp: {spec.path} has no multi-token-prediction layer "
                                    f"(model.layers.{config.num_hidden_layers}.eh_proj)")
        if spec.quantization is not None:
            raise InvalidInputError(_FIELD, "mtp: the prediction layer of a quantized checkpoint is not supported")
        self.runner = runner
        with spec.building(runner.device):
            self.predictor = MultiTokenPredictor(runner.model, config, names)
        load_weights(self.predictor, spec.path)
        pack_linear_weights(self.predictor)
        self.predictor.eval()
        attention = self.predictor.layer.self_attn
        cache = torch.zeros((runner.kv_cache.shape[0], runner.num_blocks, *runner.kv_cache.shape[3:]),
                            dtype=runner.kv_cache.dtype, device=runner.device)
        attention.k_cache, attention.v_cache = cache[0], cache[-1]
        runner.keep_hidden = True

    def propose(self, seq: Sequence, state: SequenceSpeculation, k: int) -> list[int]:
        """The first draft `observe` left for the sequence at its current length, then `k` - 1 slots that
        `complete` fills; nothing when it has none (after a preemption, say)."""
        if state.next_draft is None or state.next_draft[0] != seq.num_tokens:
            return []
        return [state.next_draft[1]] + [-1] * (k - 1)

    @torch.inference_mode()
    def complete(self, seqs: list[Sequence]) -> None:
        """Fill the slots after each sequence's first draft, one position at a time."""
        pending = [s for s in seqs if len(s.draft_token_ids) > 1]
        for i in range(1, max((len(s.draft_token_ids) for s in pending), default=1)):
            pending = [s for s in pending if len(s.draft_token_ids) > i]
            positions = [s.num_tokens - 2 + i for s in pending]
            tokens = [s.draft_token_ids[i - 1] for s in pending]
            hidden = torch.stack([s.speculation.next_draft[2] for s in pending])
            out = self._forward(tokens, positions, hidden, [(s, p, 1) for s, p in zip(pending, positions)])
            drafts = self.predictor.compute_logits(out).argmax(dim=-1).tolist()
            for seq, token, row in zip(pending, drafts, out):
                seq.draft_token_ids[i] = token
                seq.speculation.next_draft = (*seq.speculation.next_draft[:2], row)

    @torch.inference_mode()
    def observe(self, step: LaunchedStep) -> None:
        """Catch up on the positions each sequence of `step` kept, from the target's hidden states there; a
        sequence caught up to its newest token gets its next first draft."""
        spans = []
        for seq, row, start in step.spans:
            count = seq.num_computed_tokens - start
            if count > 0 and not seq.is_finished and seq.request.pooling is None:
                spans.append((seq, row, start, count))
        if not spans:
            return
        spans.sort(key=lambda span: span[3] != 1)  # decodes first
        rows = torch.cat([torch.arange(row, row + count) for _, row, _, count in spans]).to(step.hidden.device)
        tokens = [t for seq, _, start, count in spans for t in seq.token_ids[start + 1 : start + 1 + count]]
        positions = [p for _, _, start, count in spans for p in range(start, start + count)]
        out = self._forward(tokens, positions, step.hidden[rows], [(s, start, n) for s, _, start, n in spans])
        last, ends = -1, []
        for seq, _, start, count in spans:
            last += count
            if start + count == seq.num_tokens - 1:
                ends.append((seq, last))
        if not ends:
            return
        finals = out[[row for _, row in ends]]
        drafts = self.predictor.compute_logits(finals).argmax(dim=-1).tolist()
        for (seq, _), token, hidden in zip(ends, drafts, finals):
            if seq.speculation is None:
                seq.speculation = SequenceSpeculation()
            seq.speculation.next_draft = (seq.num_tokens, token, hidden)

    def _forward(self, tokens: list[int], positions: list[int], hidden: torch.Tensor,
                 spans: list[tuple[Sequence, int, int]]) -> torch.Tensor:
        """The layer's output over `spans` (sequence, first position, count; one-token spans first), whose next
        tokens and positions are `tokens` and `positions`, from the target's `hidden` there."""
        runner = self.runner
        meta = runner.attention_backend.build_metadata(
            [n for _, _, n in spans], [start + n for _, start, n in spans], [s.block_table for s, _, _ in spans],
            runner.config.block_size, sum(n == 1 for _, _, n in spans), runner.device)
        return self.predictor(tensor_on(tokens, torch.long, runner.device),
                              tensor_on(positions, torch.long, runner.device), hidden, meta)
