"""/v1/completions' request body: one prompt or several, as text or token ids, beside the shared sampling
fields."""

from pydantic import Field, field_validator, model_validator

from deployments.api.sampling_fields import SamplingFields, bound_logprobs, bound_sequences
from runtime import SamplingParams


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # 0: the prompt alone (with echo and logprobs: scored)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(p, (str, list)) and len(p) == 0 for p in v)):
            raise ValueError("prompt must not be empty")
        return v

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v):
        if v not in (None, 1):
            raise ValueError("best_of is not supported; use n")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix is not supported")
        return v

    @model_validator(mode="after")
    def _bounded_work(self):
        sequences = len(self.prompts()) * self.n
        bound_sequences(sequences)
        if self.logprobs is not None and self.max_tokens:
            bound_logprobs(sequences * self.max_tokens * (1 + self.logprobs),
                            "prompts x n x max_tokens x (1 + logprobs)", self.stream)
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)

    def to_sampling_params(self) -> SamplingParams:
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo:
            prompt_logprobs = self.logprobs
        return self.sampling_params(self.max_tokens, self.logprobs, self.constraint(), prompt_logprobs=prompt_logprobs)
