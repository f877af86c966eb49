"""Request bodies of the OpenAI routes and their sampling options (SGLang's /generate: generate_protocol.py).

Lenient on names, strict on values: unknown fields are ignored (see RequestModel), a known field with a
wrong type or range is a 400. Our extensions (SGLang's and vLLM's names) sit beside OpenAI's fields.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deployments.api.tool_schema import tool_call_schema
from runtime import InvalidInputError, SamplingParams
from runtime.text.grammar import Constraint

# Bounds on the work one request can ask for (a request over one is a 400 naming it)
MAX_STOP_TOKEN_IDS = 1024
MAX_SEQUENCES = 1024  # prompts x n in one completions or /generate call
MAX_LOGPROB_ENTRIES = 1_000_000  # n x max tokens x (1 + top logprobs): bounds the size of a streamed reply
# ... and of one reply body, built whole in memory and sent at once (about 72 bytes an entry: 7 MB)
MAX_REPLY_LOGPROB_ENTRIES = 100_000


class RequestModel(BaseModel):
    """A part of a client's request. Unknown fields are ignored, as vLLM and SGLang ignore them (clients send
    other servers' extensions and echo whole response messages back); the route reports the top-level ones in
    the `x-ignored-fields` response header. Known fields are strict: a wrong type or range is a 400. NaN and
    infinities are refused."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


MAX_STOP_REGEX_CHARS = 1024
# SGLang's stop_regex: up to 4 RE2 patterns (linear-time matching: no pattern can stall the engine)
_StopPattern = Annotated[str, Field(max_length=MAX_STOP_REGEX_CHARS)]
StopRegex = _StopPattern | Annotated[list[_StopPattern], Field(max_length=4)] | None


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk


class ContentPart(RequestModel):
    type: Literal["text"]
    text: str


class FunctionDefinition(RequestModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionName


class ChatMessage(RequestModel):
    role: str = Field(min_length=1)  # the chat template decides what a role means (custom roles pass through)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    def template_dict(self) -> dict:
        """The message as the chat template expects it: plain-text content."""
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(part.text for part in self.content)
        out.setdefault("content", "")
        return out


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


class _SamplingFields(RequestModel):
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
    prompt_logprobs_temperature: float | None = None  # vLLM's; refused below: we give the model's own logprobs

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs: not available when streaming (as vLLM)")
        if self.prompt_logprobs_temperature not in (None, 1.0):
            raise ValueError("prompt_logprobs_temperature: not supported; prompt logprobs are the model's own "
                             "(temperature 1)")
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
            **extra,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def usage_on_every_chunk(self) -> bool:
        """vLLM's `continuous_usage_stats`: each chunk carries the usage so far (with `include_usage`)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    separate_reasoning: bool = True
    # OpenAI's values; gpt-oss (harmony) takes low, medium and high, other models ignore it
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice = "auto"
    parallel_tool_calls: bool = True
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_request_template(cls, v):
        if v and "chat_template" in v:  # a client's Jinja would run on the replica: unbounded work
            raise ValueError("chat_template: request-supplied chat templates are not accepted; the model's is used")
        return v

    @model_validator(mode="after")
    def _bounded_logprobs(self):
        limit = self.max_completion_tokens or self.max_tokens
        if self.logprobs and limit:
            _bound_logprobs(self.n * limit * (1 + (self.top_logprobs or 0)), "n x max_tokens x (1 + top_logprobs)",
                            self.stream)
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, not one of the tools {names}")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def tool_constraint(self) -> Constraint | None:
        """`required` and named tool choices are enforced by a grammar over the call."""
        if not self.uses_tools or self.tool_choice == "auto":
            return None
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
        return Constraint("tool_call", tool_call_schema([(t.function.name, t.function.parameters) for t in tools]),
                          "tool_choice")

    def to_sampling_params(self) -> SamplingParams:
        top = self.top_logprobs or 0
        # a forced call makes no text, so a text format has nothing to constrain: the call's grammar wins (as
        # OpenAI accepts both; instructor's RESPONSES_TOOLS mode sends both)
        constraint = self.tool_constraint() or self.constraint()
        return self.sampling_params(self.max_completion_tokens or self.max_tokens, top if self.logprobs else None,
                                    constraint, prompt_logprobs=self.prompt_logprobs)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
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
        if sequences > MAX_SEQUENCES:
            raise ValueError(f"prompts x n is {sequences}, over the limit of {MAX_SEQUENCES} sequences per request")
        if self.logprobs is not None and self.max_tokens:
            _bound_logprobs(sequences * self.max_tokens * (1 + self.logprobs),
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


def _bound_logprobs(entries: int, product: str, stream: bool) -> None:
    """A reply's logprob entries within bounds: a streamed one's, and a lower bound for one sent whole."""
    if entries > MAX_LOGPROB_ENTRIES:
        raise ValueError(f"{product} is over {MAX_LOGPROB_ENTRIES:,} logprob entries")
    if not stream and entries > MAX_REPLY_LOGPROB_ENTRIES:
        raise ValueError(f"{product} is over {MAX_REPLY_LOGPROB_ENTRIES:,} logprob entries for one reply body; "
                         "stream it (stream: true) or ask for fewer")
