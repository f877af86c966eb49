"""Sequence classifiers and rerankers: a family's decoder with a linear `score` head over the pooled final hidden
state instead of an LM head.

Two kinds of checkpoint make one. transformers' `*ForSequenceClassification` (a cross-encoder such as a
`Qwen2ForSequenceClassification`) saves the head as `score.weight`, one row per label. A causal LM that
judges with its LM head (Qwen3-Reranker answers "yes" or "no") is made one by vLLM's config fields, given as
the engine option `hf_overrides`: `classifier_from_token` names the tokens whose LM-head rows become the labels,
and `method: from_2_way_softmax` (what `is_original_qwen3_reranker` means) takes the second token's row minus
the first's as one label, so its sigmoid is the softmax of the two logits.
"""

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.distributed import pipeline_stage
from runtime.errors import require
from runtime.models.decoder import CausalLM

CLASSIFIER_METHODS = ("from_2_way_softmax", "no_post_processing")


def classifier_of(family: type[CausalLM]) -> type[CausalLM]:
    """The family's sequence classifier (`Qwen2ForSequenceClassification`)."""
    name = family.__name__.removesuffix("ForCausalLM") + "ForSequenceClassification"
    return type(name, (SequenceClassifier, family), {})


def resolve_classifier_tokens(config: PretrainedConfig, encode_token) -> None:
    """Turn a classifier's `classifier_from_token` into `classifier_token_ids` (`encode_token`: a token's id,
    the tokenizer's) and set `num_labels` to what its method makes. Qwen3-Reranker's flag stands for its tokens
    and method, as in vLLM."""
    if getattr(config, "is_original_qwen3_reranker", False):
        config.classifier_from_token, config.method = ["no", "yes"], "from_2_way_softmax"
    tokens = getattr(config, "classifier_from_token", None)
    if not tokens:
        return
    method = getattr(config, "method", None) or "no_post_processing"
    require(method in CLASSIFIER_METHODS, "hf_overrides",
            f"method {method!r} is not one of {', '.join(CLASSIFIER_METHODS)}")
    require(method != "from_2_way_softmax" or len(tokens) == 2, "hf_overrides",
            f"from_2_way_softmax takes two classifier_from_token (the false one, then the true one); got {tokens}")
    ids = [encode_token(t) for t in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None or not 0 <= i < config.vocab_size]
    require(not unknown, "hf_overrides", f"classifier_from_token {unknown} are not tokens of the vocabulary")
    config.method, config.classifier_token_ids = method, ids
    config.num_labels = 1 if method == "from_2_way_softmax" else len(ids)


class SequenceClassifier(CausalLM):
    """A classifier built on a family (`classifier_of`): it pools only, and its pooled vector is the labels'
    logits."""

    headless = True
    classifies = True

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__(config, max_positions)
        self.token_ids: list[int] | None = getattr(config, "classifier_token_ids", None)
        self.method = getattr(config, "method", None)
        # runs where the LM head would: on the first pipeline stage, beside the sampler
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False) if pipeline_stage().first else None
        # the LM-head rows come from the embedding when the causal LM ties them
        self.rows_source = "model.embed_tokens.weight" if getattr(config, "tie_word_embeddings", False) \
            else "lm_head.weight"

    def pool_head(self, pooled: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(pooled, self.score.weight.float())

    def holds(self, param: str) -> bool:
        return self.score is not None if param.startswith("score.") else super().holds(param)

    def checkpoint_tensors(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """A reranker made from a causal LM: its `score` head is made from the LM-head rows of its tokens (the LM
        head itself is not kept)."""
        for name, tensor in tensors:
            if self.token_ids is not None and name == self.rows_source:
                rows = tensor[self.token_ids].float()
                yield "score.weight", rows[1:] - rows[:1] if self.method == "from_2_way_softmax" else rows
                if name == "lm_head.weight":
                    continue
            yield name, tensor
