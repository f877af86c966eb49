"""Per-request sampling options (vLLM's names), validated on construction."""

import math
from dataclasses import dataclass

from runtime.errors import InvalidInputError, require
from runtime.text.detokenizer import stop_pattern
from runtime.text.grammar import Constraint

# A stop string's most characters. OpenAI documents up to 4 stop sequences and no length; vLLM and SGLang bound
# neither (they hold back the longest stop's length, in characters or tokens). Matching here costs time in the
# text, not the stop, but each stop is preprocessed and up to its length is held back from a stream: 1,024
# characters is far past any real stop (an end-of-turn tag, a role marker) and keeps both small.
MAX_STOP_CHARS = 1024
MAX_PIN_TTL_S = 3600.0  # Anthropic's longest cache TTL


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16  # None: up to the end of the context
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy (exact argmax)
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: list[str] | str | None = None  # SGLang's: stop once the output matches one (RE2 syntax)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # None: off; k: the sampled token plus the top k
    prompt_logprobs: int | None = None
    # vLLM's: prompt logprobs from the logits divided by this (lower: more peaked); the sampling temperature
    # does not apply to them
    prompt_logprobs_temperature: float = 1.0
    structured_output: Constraint | None = None  # JSON schema, regex or EBNF the output must match
    # vLLM's: starts its prefix's hash chain, so only requests of the same salt share KV blocks (a tenant's)
    cache_salt: str | None = None
    # keep the prompt's first this many tokens' whole KV blocks in the prefix cache in preference, for pin_ttl_s
    # seconds after the request (a client's cache mark: Anthropic's cache_control); bounded per owner
    pin_prefix_tokens: int = 0
    pin_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        longest = max(self.stop, key=len, default="")
        require(len(longest) <= MAX_STOP_CHARS, "stop",
                f"each stop string may have at most {MAX_STOP_CHARS:,} characters; one has {len(longest):,}")
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.stop_regex = [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex or [])
        for pattern in self.stop_regex:
            try:
                stop_pattern(pattern)
            except ValueError as e:
                raise InvalidInputError("stop_regex", f"{pattern[:100]!r}: {e}") from None
        if self.top_k == 0:
            self.top_k = -1
        require(self.n >= 1, "n", f"must be at least 1, got {self.n}")
        require(self.max_tokens is None or self.max_tokens >= 0, "max_tokens",
               f"must be at least 0, got {self.max_tokens}")
        require(self.min_tokens >= 0, "min_tokens", f"must be non-negative, got {self.min_tokens}")
        require(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        require(self.temperature >= 0, "temperature", f"must be non-negative, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k == -1 or self.top_k >= 1, "top_k", f"must be -1 (disabled) or positive, got {self.top_k}")
        require(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
        require(-2 <= self.presence_penalty <= 2, "presence_penalty",
               f"must be in [-2, 2], got {self.presence_penalty}")
        require(-2 <= self.frequency_penalty <= 2, "frequency_penalty",
               f"must be in [-2, 2], got {self.frequency_penalty}")
        require(self.repetition_penalty > 0, "repetition_penalty",
               f"must be positive, got {self.repetition_penalty}")
        require(self.seed is None or -(2**63) <= self.seed < 2**63, "seed", f"must fit in int64, got {self.seed}")
        require(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs",
               f"must be in [0, 20], got {self.logprobs}")
        require(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20, "prompt_logprobs",
               f"must be in [0, 20], got {self.prompt_logprobs}")
        require(math.isfinite(self.prompt_logprobs_temperature) and self.prompt_logprobs_temperature > 0,
                "prompt_logprobs_temperature", f"must be positive, got {self.prompt_logprobs_temperature}")
        require(self.pin_prefix_tokens >= 0, "pin_prefix_tokens", f"must be non-negative, got {self.pin_prefix_tokens}")
        require(0 < self.pin_ttl_s <= MAX_PIN_TTL_S, "pin_ttl_s",
                f"must be in (0, {MAX_PIN_TTL_S:g}] seconds, got {self.pin_ttl_s}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

