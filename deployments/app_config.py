"""The `args` of `deployments:build_openai_app`, in Ray Serve LLM's `llm_configs` shape, validated at build time."""

import dataclasses
import os
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deployments.errors import field_path
from deployments.media import MediaPolicy
from deployments.parsers import REASONING_PARSERS, TOOL_CALL_FORMATS
from runtime import EngineConfig
from runtime.multimodal import ImageLimits


def _known_scheme(uri: str) -> str:
    if not uri.startswith(("file://", "s3://")):
        raise ValueError("must start with file:// or s3://")
    return uri


StorageUri = Annotated[str, AfterValidator(_known_scheme)]  # where the object-store layer can reach

DIRECT_STREAMING_ENV = "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"
_ENGINE_OPTIONS = {f.name for f in dataclasses.fields(EngineConfig) if f.init} - {"model"}
_DEPLOYMENT_OPTIONS = {
    "num_replicas", "autoscaling_config", "max_ongoing_requests", "max_queued_requests", "ray_actor_options",
    "health_check_period_s", "health_check_timeout_s", "graceful_shutdown_timeout_s",
    "graceful_shutdown_wait_loop_s", "request_router_config", "max_replicas_per_node",
}


def _only_known(options: dict, known: set[str], kind: str) -> dict:
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {unknown}; known: {sorted(known)}")
    return options


class StrictModel(BaseModel):
    """An operator's config: an unknown field is a typo, refused at start."""

    model_config = ConfigDict(extra="forbid")


class ModelLoadingConfig(StrictModel):
    model_id: str = Field(min_length=1)  # the name clients send as `model`
    model_source: str | None = None  # a Hub id or a local directory; default: model_id

    @property
    def source(self) -> str:
        return self.model_source or self.model_id


class ExperimentalConfigs(StrictModel):
    # A request's new tokens reach the server at most once per interval, merged (0: every step's at once);
    # its first and last tokens are never held.
    stream_batching_interval_ms: float = Field(default=50, ge=0)


class LoraConfig(StrictModel):
    """Ray Serve LLM's names: adapters are `<dynamic_lora_loading_path>/<name>/` in PEFT's format, and a
    request names one as `model: "<model_id>:<name>"` (or `<name>`: deployments/replica/adapters.py)."""

    # default: the app's storage_uri, under lora-adapters/<model_id>/ (where /v1/load_lora_adapter puts them)
    dynamic_lora_loading_path: StorageUri | None = None
    max_num_adapters_per_replica: int = Field(4, ge=1)  # the engine's adapter slots
    max_lora_rank: int = Field(16, ge=1)


class PlacementGroupConfig(StrictModel):
    """Ray Serve LLM's `placement_group_config`: a replica's bundles, one per tensor-parallel rank (bundle 0 holds
    the replica itself, rank 0), and how Ray places them (STRICT_SPREAD: one rank per node)."""

    bundles: list[dict[str, float]] = Field(min_length=1)
    strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = "PACK"


class CompanionConfig(StrictModel):
    """A deployment beside the model's replicas: its engine and deployment options, over the model's own."""

    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    deployment_config: dict[str, Any] = Field(default_factory=dict)


class PrefillConfig(CompanionConfig):
    """Prefill/decode disaggregation (deployments/disaggregated.py): the prefill deployment's options. Both
    deployments share a KV tier (`engine_kwargs.kv_shared_tier`, which each must have)."""


class EncoderConfig(CompanionConfig):
    """A vision-language model's image encoder as a deployment of its own (deployments/replica/encoder_server.py):
    the model's replicas have it encode their prompts' pictures. It runs the tower whole, on one device."""


class LLMConfig(StrictModel):
    model_loading_config: ModelLoadingConfig
    lora_config: LoraConfig | None = None
    prefill_config: PrefillConfig | None = None  # a prefill deployment beside the model's (disaggregation)
    encoder_config: EncoderConfig | None = None  # an image encoder deployment beside the model's
    # default: a bundle per tensor-parallel rank, STRICT_PACK
    placement_group_config: PlacementGroupConfig | None = None
    experimental_configs: ExperimentalConfigs = Field(default_factory=ExperimentalConfigs)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    deployment_config: dict[str, Any] = Field(default_factory=dict)
    accelerator_type: str | None = None
    reasoning_parser: Literal[tuple(REASONING_PARSERS)] | None = None  # how the model writes its reasoning
    tool_call_parser: Literal[tuple(TOOL_CALL_FORMATS)] | None = None  # the format the model writes calls in

    @field_validator("engine_kwargs")
    @classmethod
    def _known_engine_options(cls, v: dict) -> dict:
        return _only_known(v, _ENGINE_OPTIONS, "engine")

    @field_validator("deployment_config")
    @classmethod
    def _known_deployment_options(cls, v: dict) -> dict:
        _only_known(v, _DEPLOYMENT_OPTIONS, "deployment")
        if "num_replicas" in v and "autoscaling_config" in v:
            raise ValueError("give num_replicas or autoscaling_config, not both")
        return v

    @model_validator(mode="after")
    def _a_bundle_per_rank(self) -> "LLMConfig":
        ranks = self.ranks()
        placement = self.placement_group_config
        if placement is not None and len(placement.bundles) != ranks:
            raise ValueError(f"placement_group_config: {len(placement.bundles)} bundles for {ranks} ranks (tensor "
                             "times pipeline parallel size); give one per rank")
        if placement is not None and any(b.get("CPU", 0) < 1 and b.get("GPU", 0) < 1 for b in placement.bundles):
            raise ValueError("placement_group_config: every bundle holds a rank, which takes a CPU or a GPU")
        return self

    @model_validator(mode="after")
    def _both_sides_share_a_tier(self) -> "LLMConfig":
        if self.prefill_config is not None:
            prefill = self.prefill()
            for side, kwargs in (("engine_kwargs", self.engine_kwargs), ("prefill_config", prefill.engine_kwargs)):
                if "kv_shared_tier" not in kwargs:
                    raise ValueError(f"prefill_config: the prefill and decode deployments hand prompts over through "
                                     f"a shared KV tier: set {side}.kv_shared_tier")
        return self

    def prefill(self) -> "LLMConfig":
        """The prefill deployment's config: the model's, with `prefill_config`'s options over it."""
        return self._beside(self.prefill_config)

    def encoder(self) -> "LLMConfig":
        """The image encoder deployment's config: the model's, with `encoder_config`'s options over it, on one
        device."""
        one_device = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1}
        return self._beside(self.encoder_config, one_device, placement_group_config=None)

    def _beside(self, companion: CompanionConfig, fixed: dict | None = None, **update) -> "LLMConfig":
        return self.model_copy(update={
            "engine_kwargs": _only_known({**self.engine_kwargs, **companion.engine_kwargs, **(fixed or {})},
                                         _ENGINE_OPTIONS, "engine"),
            "deployment_config": _only_known({**self.deployment_config, **companion.deployment_config},
                                             _DEPLOYMENT_OPTIONS, "deployment"),
            "prefill_config": None, "encoder_config": None, **update})

    def ranks(self) -> int:
        """The engine's ranks: tensor times pipeline parallel size (a placement bundle each)."""
        kwargs = self.engine_kwargs
        return kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1)

    @property
    def model_id(self) -> str:
        return self.model_loading_config.model_id

    @property
    def engine_options(self) -> dict[str, Any]:
        """`engine_kwargs`, with the LoRA options `lora_config` implies."""
        if self.lora_config is None:
            return self.engine_kwargs
        return {**self.engine_kwargs, "enable_lora": True, "max_loras": self.lora_config.max_num_adapters_per_replica,
                "max_lora_rank": self.lora_config.max_lora_rank}


class AppConfig(StrictModel):
    llm_configs: list[LLMConfig] = Field(min_length=1)
    storage_uri: StorageUri = "file://./rayllm-storage"
    api_key: str | list[str] | None = None  # when set, every route but /health needs one of these keys
    # OpenTelemetry traces of requests go here, over OTLP/HTTP (deployments/tracing.py); unset, none are made
    otlp_traces_endpoint: str | None = None
    # the engine lifecycle's admin routes (deployments/http/admin.py) take it as a bearer token; off while unset
    admin_api_key: str | None = Field(None, min_length=16)
    # with API keys: each key's requests share cached prefixes only with that key's (their cache_salt starts with
    # the key's); false lets every key hit a shared system prompt's blocks (and learn, by timing, what others sent)
    cache_salt_by_key: bool = True
    max_request_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # HTTP bounds (deployments/http/request_limits.py, key_admission.py): headers; a body's minimum rate after a
    # grace; with API keys, a key's requests in flight and waiting (past them, a 429), shared out among the
    # replicas that serve HTTP (key_bounds_per_replica)
    max_headers: int = Field(256, gt=0)
    max_header_bytes: int = Field(64 * 1024, gt=0)
    body_grace_s: float = Field(10.0, gt=0)
    min_body_bytes_per_s: int = Field(32 * 1024, gt=0)
    max_requests_per_key: int = Field(128, gt=0)
    max_waiting_per_key: int = Field(256, ge=0)
    # What an API key (or, without keys, everyone) may keep in storage: uploaded and output files, in number and
    # bytes; stored responses, in number and bytes; unfinished batches (deployments/storage/usage.py)
    max_files_per_key: int = Field(10_000, gt=0)
    max_file_bytes_per_key: int = Field(100 << 30, gt=0)
    max_stored_responses_per_key: int = Field(100_000, gt=0)
    max_stored_response_bytes_per_key: int = Field(10 << 30, gt=0)
    max_active_batches_per_key: int = Field(100, gt=0)
    max_file_bytes: int = Field(512 * 1024 * 1024, gt=0)
    max_file_lines: int = Field(50_000, gt=0)
    max_batch_line_bytes: int = Field(1024 * 1024, gt=0)
    # batch lines in flight per RUNNING replica of their model; default: twice its engine's max_num_seqs, every
    # seat and as many lines again on their way in or out (tokenizing, answering), so the seats stay full (online
    # requests are still admitted first)
    batch_concurrency: int | None = Field(None, gt=0)
    # the batch manager starts with the app, so the first batch does not wait for its process; false: on the
    # first Files or Batches call (an app that runs no batches has one process fewer)
    start_batch_manager: bool = True
    # s3:// prefixes a batch's input_file_id may name, besides this app's own storage_uri; nothing else is read
    batch_input_prefixes: list[str] = Field(default_factory=list)
    # Pictures in requests (deployments/media.py): http(s) hosts and s3:// prefixes they may be read from (none by
    # default: data: URLs only; allowed_media_domains is vLLM's name), and the bounds on one picture's fetch,
    # bytes and pixels
    allowed_media_domains: list[str] = Field(default_factory=list)
    allowed_media_prefixes: list[str] = Field(default_factory=list)
    media_fetch_timeout_s: float = Field(MediaPolicy.fetch_timeout_s, gt=0)
    max_image_bytes: int = Field(ImageLimits.max_bytes, gt=0)
    max_image_pixels: int = Field(ImageLimits.max_pixels, gt=0)
    # Serve options of the OpenAI ingress (num_replicas, autoscaling_config, ray_actor_options, ...). Two
    # replicas by default, at most as many per node as the cluster's nodes require (builder.py): losing one node
    # never takes the app's front door.
    ingress_deployment_config: dict[str, Any] = Field(default_factory=lambda: {"num_replicas": 2})
    # A file:// storage_uri that every node sees (NFS, a shared volume). Without it, a file:// storage is
    # refused on a multi-node cluster: each node would keep its own batches, files and stored responses.
    shared_storage: bool = False
    # The model's replicas serve HTTP themselves, with no ingress hop (one model only; see direct_server.py).
    # Default: Ray Serve LLM's switch, the environment variable RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1.
    direct_streaming: bool = Field(default_factory=lambda: os.environ.get(DIRECT_STREAMING_ENV) == "1")

    def key_bounds_per_replica(self) -> tuple[int, int]:
        """A key's requests in flight and waiting in each replica that serves HTTP (the ingress's, or the model's
        in direct streaming): the app's bounds shared among them, rounded up. An autoscaling deployment counts
        its min_replicas, so a key's bounds hold at its smallest size and loosen as it grows."""
        options = self.llm_configs[0].deployment_config if self.direct_streaming else self.ingress_deployment_config
        autoscaling = options.get("autoscaling_config") or {}
        replicas = options.get("num_replicas")
        replicas = max(1, replicas if isinstance(replicas, int) else autoscaling.get("min_replicas", 1))
        return -(-self.max_requests_per_key // replicas), -(-self.max_waiting_per_key // replicas)

    def batch_seats(self) -> dict[str, int]:
        """Each model's batch lines in flight per running replica."""
        return {llm.model_id: self.batch_concurrency
                or 2 * llm.engine_kwargs.get("max_num_seqs", EngineConfig.max_num_seqs) for llm in self.llm_configs}

    @field_validator("ingress_deployment_config")
    @classmethod
    def _known_ingress_options(cls, v: dict) -> dict:
        _only_known(v, _DEPLOYMENT_OPTIONS - {"request_router_config"}, "ingress deployment")
        if "num_replicas" in v and "autoscaling_config" in v:
            raise ValueError("give num_replicas or autoscaling_config, not both")
        return v

    @model_validator(mode="after")
    def _unique_model_ids(self):
        ids = [c.model_id for c in self.llm_configs]
        if len(ids) != len(set(ids)):
            raise ValueError(f"model ids must be unique, got {ids}")
        return self

    @model_validator(mode="after")
    def _adapters_in_the_apps_storage(self):
        for config in self.llm_configs:
            lora = config.lora_config
            if lora is not None and lora.dynamic_lora_loading_path is None:
                lora.dynamic_lora_loading_path = f"{self.storage_uri.rstrip('/')}/lora-adapters/{config.model_id}"
        return self

    @model_validator(mode="after")
    def _direct_streaming_serves_one_model(self):
        if self.direct_streaming and len(self.llm_configs) > 1:
            raise ValueError(f"direct_streaming serves one model per app, got {len(self.llm_configs)} llm_configs")
        if self.direct_streaming and self.llm_configs[0].prefill_config is not None:
            raise ValueError("direct_streaming has no ingress to send a request to prefill first: it runs without "
                             "prefill_config")
        return self

    @property
    def api_keys(self) -> list[str]:
        return [self.api_key] if isinstance(self.api_key, str) else list(self.api_key or [])

    @field_validator("batch_input_prefixes", "allowed_media_prefixes")
    @classmethod
    def _s3_prefixes(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not p.startswith("s3://") or len(p.rstrip("/")) <= len("s3://")]
        if bad:
            raise ValueError(f"each must be an s3://bucket/ prefix, got {bad}")
        return v

    def media_policy(self) -> MediaPolicy:
        return MediaPolicy(tuple(d.lower() for d in self.allowed_media_domains), tuple(self.allowed_media_prefixes),
                           ImageLimits(self.max_image_bytes, self.max_image_pixels), self.media_fetch_timeout_s)

    def may_read_batch_input(self, uri: str) -> bool:
        """Whether a batch may read its input from `uri` (an s3:// object): only under the allowed prefixes."""
        prefixes = [*self.batch_input_prefixes, *([self.storage_uri] if self.storage_uri.startswith("s3://") else [])]
        return any(uri.startswith(p if p.endswith("/") else p + "/") for p in prefixes)


def replica_name(model_id: str, prefill: bool = False) -> str:
    """The Serve deployment name of a model's replicas (or of its prefill replicas)."""
    return "LLMServer:" + model_id.replace("/", "--") + (":prefill" if prefill else "")


def encoder_name(model_id: str) -> str:
    """The Serve deployment name of a model's image encoder (`encoder_config`)."""
    return "ImageEncoder:" + model_id.replace("/", "--")


def parse_app_config(args: dict) -> AppConfig:
    """Validate builder args; the error names each offending field by its path."""
    try:
        return AppConfig.model_validate(args)
    except ValidationError as e:
        problems = [f"{field_path(err['loc']) or 'args'}: {err['msg']}" for err in e.errors()]
        raise ValueError("invalid build_openai_app args: " + "; ".join(problems)) from None
