"""How an embedding model pools: which prompt positions' final hidden states (after the model's last norm) make
the embedding, and whether it is L2-normalised; a classifier's pooled state goes through its head, to logits.

The options are vLLM's `pooler_config` (`pooling_type`: last | mean, `normalize`); what is left unset comes
from a sentence-transformers checkpoint (`modules.json`, its Pooling module's `config.json`, a Normalize
module), else last-token pooling, normalised, as Qwen3-Embedding does.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from runtime.errors import InvalidInputError, require

POOLING_TYPES = ("last", "mean")
_SENTENCE_TRANSFORMERS_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}


@dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str | None = None  # last: the last prompt token; mean: every prompt token (no prefix-cache hits)
    normalize: bool | None = None  # L2-normalise the pooled vector

    @classmethod
    def parse(cls, value: "PoolerConfig | dict | None") -> "PoolerConfig":
        """The option as written in engine kwargs (a dict, vLLM's names), checked."""
        if isinstance(value, PoolerConfig):
            return value
        value = dict(value or {})
        unknown = set(value) - {"pooling_type", "normalize"}
        require(not unknown, "pooler_config", f"unknown keys {sorted(unknown)}; expected pooling_type, normalize")
        kind = value.get("pooling_type")
        kind = kind.lower() if isinstance(kind, str) else kind
        require(kind is None or kind in POOLING_TYPES, "pooler_config",
                f"pooling_type must be one of {', '.join(POOLING_TYPES)}; got {value.get('pooling_type')!r}")
        normalize = value.get("normalize")
        require(normalize is None or isinstance(normalize, bool), "pooler_config", "normalize must be a boolean")
        return cls(kind, normalize)

    def resolve(self, model_dir: Path, classifies: bool = False) -> "PoolerConfig":
        """Every field set: this config's, else the checkpoint's, else last-token pooling, normalised (a
        classifier's logits: last-token, as transformers' classifiers pool, not normalised)."""
        if self.pooling_type is not None and self.normalize is not None:
            return self
        saved = PoolerConfig("last", False) if classifies else \
            _from_sentence_transformers(model_dir) or PoolerConfig("last", True)
        return replace(saved, **{k: v for k, v in vars(self).items() if v is not None})

    def pool(self, total: torch.Tensor, num_tokens: int) -> list[float]:
        """The embedding from the pooled rows' sum (`num_tokens` of them for mean pooling; one for last)."""
        vector = total / num_tokens if self.pooling_type == "mean" else total
        if self.normalize:
            vector = torch.nn.functional.normalize(vector, dim=-1)
        return vector.tolist()


def _from_sentence_transformers(model_dir: Path) -> PoolerConfig | None:
    """The pooling a sentence-transformers checkpoint declares, or None when it declares none."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
    if "Pooling" not in kinds:
        return None
    pooling = json.loads((model_dir / kinds["Pooling"] / "config.json").read_text())
    modes = [kind for key, kind in _SENTENCE_TRANSFORMERS_MODES.items() if pooling.get(key)]
    others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and
              k not in _SENTENCE_TRANSFORMERS_MODES]
    if others or len(modes) != 1:
        raise InvalidInputError("pooler_config", f"the checkpoint's pooling ({', '.join(others + modes) or 'none'}) "
                                                 f"is not one of {', '.join(POOLING_TYPES)}; set pooling_type")
    return PoolerConfig(modes[0], "Normalize" in kinds)


def label_probabilities(logits: list[float]) -> list[float]:
    """A classifier's logits as probabilities: their softmax, or one label's sigmoid (as vLLM's and
    sentence-transformers' cross-encoders take them)."""
    values = torch.tensor(logits)
    return (values.sigmoid() if len(logits) == 1 else values.softmax(-1)).tolist()
