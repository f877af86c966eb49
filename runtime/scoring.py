"""Scoring texts against each other, as vLLM's score and rerank routes do.

A classifier with one label (a cross-encoder, or a reranker made from a causal LM) reads each pair as one
prompt, and the sigmoid of its logit is the pair's score. An embedding model embeds each text alone, and the
score is the cosine of the two embeddings. One text against many pairs it with each; two equal lists pair
item by item.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from runtime.errors import require
from runtime.pooling import label_probabilities


@dataclass(frozen=True)
class ScoringPlan:
    prompts: list[list[int]]  # what the engine pools, in order
    # an embedding model's pairs (indices into `prompts`); None: a classifier's prompts, one pair each
    pairs: list[tuple[int, int]] | None

    @classmethod
    def make(cls, tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, labels: list[str] | None,
             first: list[str], second: list[str], names: tuple[str, str] = ("text_1", "text_2"),
             max_tokens: tuple[int, int] = (0, 0)) -> "ScoringPlan":
        """The prompts to pool for scoring `first` against `second` (`names`: their fields, for errors);
        `labels`: the model's if it classifies; `max_tokens`: each side's texts cut to that many tokens first
        (0: not cut; vLLM's max_tokens_per_query and max_tokens_per_doc)."""
        require(len(first) > 0, names[0], "must not be empty")
        require(len(second) > 0, names[1], "must not be empty")
        require(len(first) in (1, len(second)), names[1],
                f"{len(second)} items against {len(first)}: give one {names[0]}, or as many as {names[1]}")
        first, second = (_cut(tokenizer, texts, limit) for texts, limit in ((first, max_tokens[0]),
                                                                            (second, max_tokens[1])))
        if labels is None:  # each text embedded once
            encode = tokenizer.encode
            return cls([encode(t) for t in first] + [encode(t) for t in second],
                       [(i if len(first) > 1 else 0, len(first) + i) for i in range(len(second))])
        require(len(labels) == 1, "model", f"scores pairs with one label; this classifier has {len(labels)}")
        encode_pair = pair_encoder(tokenizer, config)
        return cls([encode_pair(a, b) for a, b in zip(first * len(second) if len(first) == 1 else first, second)],
                   None)

    def scores(self, pooled: list[list[float]], activation: bool = True) -> list[float]:
        """The pairs' scores from what the engine pooled for `prompts`, in order (`activation` False: a
        classifier's logits, not their probabilities)."""
        if self.pairs is None:
            return [label_probabilities(logits)[0] if activation else logits[0] for logits in pooled]
        vectors = [torch.tensor(v) for v in pooled]
        return [torch.nn.functional.cosine_similarity(vectors[a], vectors[b], dim=0).item() for a, b in self.pairs]


def _cut(tokenizer: PreTrainedTokenizerBase, texts: list[str], limit: int) -> list[str]:
    """Each text cut to its first `limit` tokens (0: as it is)."""
    if not limit:
        return texts
    return [tokenizer.decode(tokenizer.encode(t, add_special_tokens=False)[:limit]) for t in texts]


def pair_encoder(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> Callable[[str, str], list[int]]:
    """How a classifier reads a pair: the tokenizer's pair encoding (a cross-encoder's separator between them),
    or, for a reranker made from a causal LM (`classifier_from_token`), the two texts joined into one, whose own
    templates mark them; config.json's `use_sep_token` chooses, as in vLLM."""
    if getattr(config, "use_sep_token", not getattr(config, "classifier_from_token", None)):
        return lambda a, b: tokenizer(text=a, text_pair=b)["input_ids"]
    return lambda a, b: tokenizer(a + b)["input_ids"]
