"""Engine options, validated on construction (vLLM's names where vLLM has one).

Values only: nothing here reads the model. What the options name (the model's
files and config, the dtype `auto` picks, the context length it allows) is
resolved when the engine is built (`runtime.models.spec`), and each rank's model
runner chooses its attention kernels.
"""

from dataclasses import dataclass

import torch

from runtime.errors import InvalidInputError, require
from runtime.pooling import PoolerConfig

DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


SPECULATIVE_METHODS = ("ngram", "draft_model", "mtp")
_SPECULATIVE_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
                     "disable_by_batch_size"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """`speculative_config` as vLLM names it: `method` ngram (prompt lookup), draft_model or mtp (the checkpoint's
    own multi-token-prediction layer), checked on construction."""

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
        unknown = set(value) - _SPECULATIVE_KEYS
        require(not unknown, field,
                f"unknown keys {sorted(unknown)}; expected {', '.join(sorted(_SPECULATIVE_KEYS))}")
        method = value.get("method") or ("draft_model" if value.get("model") else None)
        require(method in SPECULATIVE_METHODS, f"{field}.method",
                f"expected one of {', '.join(SPECULATIVE_METHODS)}; got {method!r}")
        k = value.get("num_speculative_tokens")
        require(isinstance(k, int) and 1 <= k <= 16, f"{field}.num_speculative_tokens",
                f"must be an integer in [1, 16], got {k!r}")
        config = cls(method, k, **{key: value[key] for key in _SPECULATIVE_KEYS - {"method", "num_speculative_tokens"}
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


@dataclass(frozen=True)
class SharedTierConfig:
    """`kv_shared_tier` (runtime.kv_tier.shared)."""

    size_gib: float  # what the tier keeps published, over every engine
    name: str | None = None  # engines of one name share blocks; default: the model's path
    min_prompt_tokens: int = 1024  # shorter prompts are not published

    @classmethod
    def parse(cls, value: "SharedTierConfig | dict | None") -> "SharedTierConfig | None":
        if isinstance(value, dict):
            unknown = set(value) - {"size_gib", "name", "min_prompt_tokens"}
            require(not unknown and "size_gib" in value, "kv_shared_tier",
                    f"takes size_gib (required), name and min_prompt_tokens; got {sorted(value)}")
            return cls(**value)
        return value


DEFAULT_IMAGES_PER_PROMPT = 8

# the KV cache's element type, where it is not the model's ("auto")
KV_CACHE_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


@dataclass
class EngineConfig:
    model: str
    # default: the model's directory
    tokenizer: str | None = None
    # auto: on GPU the checkpoint's 16-bit dtype, else bfloat16; float32 on CPU
    dtype: str = "auto"
    # auto: cuda when available, else cpu
    device: str = "auto"
    # the checkpoint's quantization method, detected from its config.json; naming one insists on it
    # (compressed-tensors)
    quantization: str | None = None
    tensor_parallel_size: int = 1
    # stages the decoder's layers are split into, each a tensor-parallel group of its own (runtime.worker.pipeline)
    pipeline_parallel_size: int = 1
    # layers per stage, as a list or "4,4" (vLLM's VLLM_PP_LAYER_PARTITION); default: even, the remainder to the last
    # stages
    pp_layer_partition: list[int] | str | None = None
    # MoE experts spread whole over the tensor-parallel ranks (vLLM's name) instead of each sharded over all of them
    enable_expert_parallel: bool = False
    # default: the model's max_position_embeddings
    max_model_len: int | None = None
    max_num_seqs: int = 256
    # running sequences past which an owner (API key) is admitted more only while no other owner under it waits,
    # and gives such a newcomer a seat back, one a step (a lone owner still fills the engine);
    # default: max_num_seqs // 2
    max_num_seqs_per_owner: int | None = None
    # running sequences of a lower priority (batch lines) admitted while a higher one (online) runs or waits, and
    # for scheduler.FOREGROUND_STEPS steps after: short steps for the higher one's latency; more seats give the
    # batch more throughput and online requests a longer time to first token (figures: docs/performance.md);
    # default: max_num_seqs // 16
    max_num_seqs_background: int | None = None
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    # the KV budget; default: every sequence at full length (max_num_seqs x max_model_len), capped at 2 GiB on
    # CPU and on GPU by what gpu_memory_utilization leaves after a profiling step
    kv_cache_bytes: int | None = None
    # auto: the model's dtype; fp8 (or fp8_e4m3): e4m3 with a scale of 1, half of bf16's bytes per token
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    # GiB of host memory (pinned on a GPU) holding full prefix blocks the KV pool evicts, loaded back on a later
    # hit instead of recomputed (vLLM's name); needs prefix caching
    kv_offloading_size: float | None = None
    # a KV tier shared by the engines of a Ray cluster: {size_gib, name (default: the model's path),
    # min_prompt_tokens (1024)}; prompts' blocks published there and fetched into the offload tier
    # (runtime.kv_tier.shared)
    kv_shared_tier: SharedTierConfig | dict | None = None
    # GPU: no CUDA graphs (every decode step launches its kernels one by one)
    enforce_eager: bool = False
    seed: int = 0
    # serve LoRA adapters (runtime.lora), each request with at most one
    enable_lora: bool = False
    # adapter slots on the device; the least recently used idle one is replaced
    max_loras: int = 4
    max_lora_rank: int = 16
    # what the model serves: generate (chat, completions) | pooling (embeddings); the engine runs either kind of
    # request, in the same batches
    runner: str = "generate"
    # embeddings: {pooling_type: last | mean, normalize: bool}; unset keys from the checkpoint's
    # sentence-transformers files, else last-token pooling, normalised (a classifier's: last, not normalised)
    pooler_config: PoolerConfig | dict | None = None
    # config.json fields set over the checkpoint's before the model is built (vLLM's name), e.g. Qwen3-Reranker's
    # {architectures: [Qwen3ForSequenceClassification], classifier_from_token: [no, yes], method: from_2_way_softmax}
    # (runtime.models.classifier)
    hf_overrides: dict | None = None
    # {method: ngram | draft_model, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model (the
    # draft), disable_by_batch_size}
    speculative_config: SpeculativeConfig | dict | None = None
    # launch each step before the previous one's tokens reach the host, so on a GPU the host's scheduling and
    # post-processing overlap the device's work (runtime.engine.llm_engine.LLMEngine.step)
    async_scheduling: bool = False
    # servers (AsyncLLMEngine): step the engine in a process of its own, so the server's Python does not hold up
    # its steps (runtime.engine.engine_process); on CPU it leaves a quarter of the cores (at least one) to the
    # server. Tensor parallel size 1 only
    engine_process: bool = False
    # torch | cpu | triton | flash; auto: flash, else triton on GPU; cpu (the C++ kernel) on CPU where it
    # applies, else torch
    attention_backend: str = "auto"
    # run a prefill at the largest chunk and a decode at the full batch before serving (runtime.engine.warm_up);
    # servers turn it on (deployments/replica/server.py)
    warm_up: bool = False
    # a vision-language model's pictures per prompt, at most (vLLM's name and shape: {"image": 4}); 0 serves it
    # text-only
    limit_mm_per_prompt: dict[str, int] | None = None
    # what the checkpoint's processor is called with beside every prompt's pictures (vLLM's name), e.g. Gemma 3's
    # {"do_pan_and_scan": true}
    mm_processor_kwargs: dict | None = None

    def __post_init__(self) -> None:
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device not in ("cpu", "cuda"):
            raise InvalidInputError("device", f"expected 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise InvalidInputError("dtype", f"expected one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        require(self.runner in ("generate", "pooling"), "runner", f"expected generate or pooling, got {self.runner!r}")
        self.pooler_config = PoolerConfig.parse(self.pooler_config)
        require(self.hf_overrides is None or isinstance(self.hf_overrides, dict), "hf_overrides",
                f"expected a mapping of config.json fields, got {type(self.hf_overrides).__name__}")
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self.kv_shared_tier = SharedTierConfig.parse(self.kv_shared_tier)
        require(self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be at least 1")
        require(self.pipeline_parallel_size >= 1, "pipeline_parallel_size", "must be at least 1")
        self.pp_layer_partition = self._partition()
        require(self.speculative_config is None or self.speculative_config.method == "ngram"
                or self.world_size == 1, "speculative_config.method",
                "a draft model or MTP runs only with one rank (tensor and pipeline parallel size 1); ngram works at "
                "any size")
        require(not self.async_scheduling or (self.speculative_config is None and self.world_size == 1),
                "async_scheduling", "runs without speculative_config and with one rank (tensor and pipeline parallel "
                "size 1): both need each step's tokens on the host before the next step is scheduled")
        require(not self.engine_process or self.world_size == 1, "engine_process",
                "runs with one rank (the workers of a larger replica are Ray actors of the server's)")
        require(self.max_model_len is None or self.max_model_len >= 2, "max_model_len", "must be at least 2")
        require(self.max_num_seqs >= 1, "max_num_seqs", "must be at least 1")
        require(self.max_num_seqs_per_owner is None or self.max_num_seqs_per_owner >= 1, "max_num_seqs_per_owner",
                "must be at least 1")
        require(self.max_num_seqs_background is None or self.max_num_seqs_background >= 1, "max_num_seqs_background",
                "must be at least 1")
        require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be at least 1")
        require(self.block_size >= 1, "block_size", "must be at least 1")
        require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]")
        require(self.kv_cache_bytes is None or self.kv_cache_bytes > 0, "kv_cache_bytes", "must be positive")
        require(self.kv_offloading_size is None or self.kv_offloading_size > 0, "kv_offloading_size",
                "must be positive (GiB)")
        require(self.kv_offloading_size is None or self.speculative_config is None
                or self.speculative_config.method == "ngram", "kv_offloading_size",
                "the tier holds the target model's blocks only: it runs without a draft model")
        require(self.kv_shared_tier is None or (self.kv_offloading_size is not None and self.world_size == 1
                                                and not self.engine_process), "kv_shared_tier",
                "fetches into the offload tier (set kv_offloading_size), with one rank, in the server's "
                "process (not engine_process)")
        require(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
                f"{self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        self.limit_mm_per_prompt = {"image": DEFAULT_IMAGES_PER_PROMPT, **(self.limit_mm_per_prompt or {})}
        require(set(self.limit_mm_per_prompt) == {"image"} and all(
            isinstance(n, int) and n >= 0 for n in self.limit_mm_per_prompt.values()), "limit_mm_per_prompt",
            f"takes {{\"image\": N}} with N >= 0; got {self.limit_mm_per_prompt}")
        require(self.max_loras >= 1, "max_loras", "must be at least 1")
        require(self.max_lora_rank >= 1, "max_lora_rank", "must be at least 1")

    @property
    def world_size(self) -> int:
        """The replica's ranks: tensor times pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _partition(self) -> tuple[int, ...] | None:
        """`pp_layer_partition` as a tuple of positive layer counts, one per stage (their sum is checked against
        the model: runtime.models.spec)."""
        value = self.pp_layer_partition
        if value is None:
            return None
        try:
            sizes = tuple(int(n) for n in (value.split(",") if isinstance(value, str) else value))
        except (TypeError, ValueError):
            raise InvalidInputError("pp_layer_partition", f"expected layer counts such as [4, 4]; got {value!r}") \
                from None
        require(len(sizes) == self.pipeline_parallel_size and all(n > 0 for n in sizes), "pp_layer_partition",
                f"expected {self.pipeline_parallel_size} positive layer counts (one per stage); got {list(sizes)}")
        return sizes
