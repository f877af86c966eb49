"""The body of SGLang's native /generate: `text` or `input_ids`, and SGLang's `sampling_params`."""

from pydantic import ConfigDict, Field, field_validator, model_validator

from deployments.api.request_model import RequestModel
from deployments.api.sampling_fields import MAX_STOP_TOKEN_IDS, StopRegex, bound_sequences
from runtime import InvalidInputError, SamplingParams
from runtime.text.grammar import Constraint

MAX_GENERATE_STOPS = 64  # /generate's `stop` (OpenAI's routes allow 4)


class GenerateSamplingParams(RequestModel):
    """SGLang's `sampling_params` for /generate."""

    max_new_tokens: int = Field(128, ge=0)
    min_new_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0, le=1)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    stop_regex: StopRegex = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, alias="sampling_seed")
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    # strict, as SGLang builds its SamplingParams from these keys: an unknown one is a 400 there too
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, v):
        if isinstance(v, list) and len(v) > MAX_GENERATE_STOPS:
            raise ValueError(f"at most {MAX_GENERATE_STOPS} stop strings")
        return v

    def constraint(self) -> Constraint | None:
        given = [Constraint(kind, value, kind) for kind, value in
                 (("json_schema", self.json_schema), ("regex", self.regex), ("ebnf", self.ebnf)) if value is not None]
        if len(given) > 1:
            raise InvalidInputError(given[1].param, "give at most one of json_schema, regex and ebnf")
        return given[0] if given else None

    def to_sampling_params(self, logprobs: int | None) -> SamplingParams:
        return SamplingParams(
            structured_output=self.constraint(),
            n=self.n, max_tokens=self.max_new_tokens, min_tokens=self.min_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty, stop=self.stop, stop_token_ids=self.stop_token_ids,
            stop_regex=self.stop_regex, ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.no_stop_trim, seed=self.seed, logprobs=logprobs,
        )


class GenerateRequest(RequestModel):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=20)
    rid: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _one_prompt_field(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text or input_ids")
        if isinstance(self.text, list) and not self.text or self.input_ids == []:
            raise ValueError("the prompt list must not be empty")
        return self

    @model_validator(mode="after")
    def _bounded_work(self):
        bound_sequences(len(self.prompts()[0]) * self.sampling_params.n)
        return self

    def prompts(self) -> tuple[list[str | list[int]], bool]:
        """The prompts, and whether the request was a batch (a list of prompts)."""
        if self.text is not None:
            return ([self.text], False) if isinstance(self.text, str) else (list(self.text), True)
        ids = self.input_ids
        if ids and isinstance(ids[0], list):
            return list(ids), True
        return [ids], False
