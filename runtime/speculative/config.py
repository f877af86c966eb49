"""`speculative_config` as vLLM names it: `method` ngram (prompt lookup), draft_model or mtp (the checkpoint's own
multi-token-prediction layer), checked on construction."""

from dataclasses import dataclass

from runtime.errors import require

METHODS = ("ngram", "draft_model", "mtp")
_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
         "disable_by_batch_size"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    model: str | None = None  # the draft checkpoint (method draft_model): the target's vocabulary
    disable_by_batch_size: int = 32  # no proposals in a step with more decoding sequences than this

    @classmethod
    def parse(cls, value: "SpeculativeConfig | dict | None") -> "SpeculativeConfig | None":
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        field = "speculative_config"
        require(isinstance(value, dict), field, f"expected a mapping, got {type(value).__name__}")
        unknown = set(value) - _KEYS
        require(not unknown, field, f"unknown keys {sorted(unknown)}; expected {', '.join(sorted(_KEYS))}")
        method = value.get("method") or ("draft_model" if value.get("model") else None)
        require(method in METHODS, f"{field}.method", f"expected one of {', '.join(METHODS)}; got {method!r}")
        k = value.get("num_speculative_tokens")
        require(isinstance(k, int) and 1 <= k <= 16, f"{field}.num_speculative_tokens",
                f"must be an integer in [1, 16], got {k!r}")
        config = cls(method, k, **{key: value[key] for key in _KEYS - {"method", "num_speculative_tokens"}
                                   if key in value})
        if method == "ngram":
            lo, hi = config.prompt_lookup_min, config.prompt_lookup_max
            require(isinstance(lo, int) and lo >= 1, f"{field}.prompt_lookup_min", f"must be at least 1, got {lo!r}")
            require(isinstance(hi, int) and hi >= lo, f"{field}.prompt_lookup_max",
                    f"must be at least prompt_lookup_min ({lo}), got {hi!r}")
        elif method == "draft_model":
            require(isinstance(config.model, str) and config.model, f"{field}.model",
                    "method draft_model needs the draft checkpoint's path or id")
        else:
            require(config.model is None, f"{field}.model", "method mtp drafts with the target's own layer: no model")
        require(isinstance(config.disable_by_batch_size, int) and config.disable_by_batch_size >= 1,
                f"{field}.disable_by_batch_size", f"must be at least 1, got {config.disable_by_batch_size!r}")
        return config
