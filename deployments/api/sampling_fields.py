"""The sampling options that chat and completions requests share, their structured-output constraints, and the
bounds on the work one request can ask for (SGLang's /generate has its own: generate/protocol.py).

Lenient on names, strict on values: unknown fields are ignored (see RequestModel), a known field with a
wrong type or range is a 400. Our extensions (SGLang's and vLLM's names) sit beside OpenAI's fields.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from deployments.api.request_model import Priority, RequestModel
from runtime import InvalidInputError, SamplingParams
from runtime.sampling_params import MAX_PIN_TTL_S
from runtime.text.grammar import Constraint

# Bounds on the work one request can ask for (a request over one is a 400 naming it)
MAX_STOP_TOKEN_IDS = 1024
MAX_SEQUENCES = 1024  # prompts x n in one completions or /generate call
MAX_LOGPROB_ENTRIES = 1_000_000  # n x max tokens x (1 + top logprobs): bounds the size of a streamed reply
# ... and of one reply body, built whole in memory and sent at once
MAX_REPLY_LOGPROB_ENTRIES = 100_000


MAX_STOP_REGEX_CHARS = 1024
# SGLang's stop_regex: up to 4 RE2 patterns (linear-time matching: no pattern can stall the engine)
_StopPattern = Annotated[str, Field(max_length=MAX_STOP_REGEX_CHARS)]
StopRegex = _StopPattern | Annotated[list[_StopPattern], Field(max_length=4)] | None


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    schema_: dict = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is 'json_schema'")
        return self


class StructuredOutputs(RequestModel):
    """vLLM's `structured_outputs`: one of a JSON schema, a regex, an EBNF grammar or a list of choices."""

    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = Field(None, min_length=1)

    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


def _extension_constraint(param: str, kind: str, value) -> Constraint:
    """vLLM's names for a constraint, as ours; `choice` becomes a grammar whose outputs are exactly the choices."""
    if kind == "json_schema" and not isinstance(value, str):
        value = json.dumps(value)
    if kind == "choice":
        kind, value = "ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    return Constraint(kind, value, param)


class SamplingFields(RequestModel):
    """Sampling options shared by chat and completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    stop_regex: StopRegex = None  # SGLang's
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # vLLM's: only requests of the same salt share cached prefixes (the app may salt every request by its API key)
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    # ours: keep the prompt's first this many tokens cached in preference for pin_ttl_s seconds (the Anthropic
    # route sets them from its cache_control marks); bounded per API key
    pin_prefix_tokens: int = Field(0, ge=0)
    pin_ttl_s: float = Field(300.0, gt=0, le=MAX_PIN_TTL_S)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's name
    guided_json: dict | str | None = None  # vLLM's older names
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's: each prompt token's logprob and top ones
    return_token_ids: bool = False  # vLLM's: the prompt's and each choice's token ids in the reply
    prompt_logprobs_temperature: float | None = Field(None, gt=0)  # vLLM's: prompt logprobs of logits / it
    priority: int = Priority

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs: not available when streaming (as vLLM)")
        return self

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, v):
        for key, bias in (v or {}).items():
            if not key.lstrip("-").isdigit() or len(key) > 20:  # longer than any int64: not a token id
                raise ValueError(f"keys must be token ids, got {key[:40]!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"bias for token {key} must be in [-100, 100]")
        return v

    def constraint(self) -> Constraint | None:
        """The structured-output constraint asked for, if any (at most one)."""
        found = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema":
            found.append(Constraint("json_schema", json.dumps(fmt.json_schema.schema_), "response_format"))
        elif fmt is not None and fmt.type == "json_object":
            found.append(Constraint("json_object", "", "response_format"))
        if self.regex is not None:
            found.append(Constraint("regex", self.regex, "regex"))
        if self.ebnf is not None:
            found.append(Constraint("ebnf", self.ebnf, "ebnf"))
        so = self.structured_outputs or StructuredOutputs()
        for param, kind, value in (
                ("structured_outputs.json", "json_schema", so.json_), ("guided_json", "json_schema", self.guided_json),
                ("structured_outputs.regex", "regex", so.regex), ("guided_regex", "regex", self.guided_regex),
                ("structured_outputs.grammar", "ebnf", so.grammar), ("guided_grammar", "ebnf", self.guided_grammar),
                ("structured_outputs.choice", "choice", so.choice), ("guided_choice", "choice", self.guided_choice)):
            if value is not None:
                found.append(_extension_constraint(param, kind, value))
        if len(found) > 1:
            raise InvalidInputError(found[1].param, "give at most one structured-output constraint "
                                                    f"(response_format, regex, ebnf or {found[1].param})")
        return found[0] if found else None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, structured_output: Constraint | None,
                        **extra: Any) -> SamplingParams:
        temperature = 1.0 if self.temperature is None else self.temperature
        return SamplingParams(
            n=self.n,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()} or None,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            stop_regex=self.stop_regex,
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=logprobs,
            structured_output=structured_output,
            prompt_logprobs_temperature=self.prompt_logprobs_temperature or 1.0,
            cache_salt=self.cache_salt,
            pin_prefix_tokens=self.pin_prefix_tokens,
            pin_ttl_s=self.pin_ttl_s,
            **extra,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def usage_on_every_chunk(self) -> bool:
        """vLLM's `continuous_usage_stats`: each chunk carries the usage so far (with `include_usage`)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


def bound_sequences(sequences: int) -> None:
    """A completions or /generate call's prompts x n within MAX_SEQUENCES."""
    if sequences > MAX_SEQUENCES:
        raise ValueError(f"prompts x n is {sequences}, over the limit of {MAX_SEQUENCES} sequences per request")


def bound_logprobs(entries: int, product: str, stream: bool) -> None:
    """A reply's logprob entries within bounds: a streamed one's, and a lower bound for one sent whole."""
    if entries > MAX_LOGPROB_ENTRIES:
        raise ValueError(f"{product} is over {MAX_LOGPROB_ENTRIES:,} logprob entries")
    if not stream and entries > MAX_REPLY_LOGPROB_ENTRIES:
        raise ValueError(f"{product} is over {MAX_REPLY_LOGPROB_ENTRIES:,} logprob entries for one reply body; "
                         "stream it (stream: true) or ask for fewer")


def salted_by_owner(body, owner: str | None):
    """`body` with its cache salt prefixed by its API key's owner id (`cache_salt_by_key`): no key's request hits
    a prefix another key's computed, whatever salt it names. A body without the field, or no owner: as it is."""
    if owner is not None and "cache_salt" in type(body).model_fields:
        body.cache_salt = f"key {owner}" + (f"|{body.cache_salt}" if body.cache_salt else "")
    return body
