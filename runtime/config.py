"""Engine options, validated on construction (vLLM's names where vLLM has one)."""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from kernels import choose_attention_backend
from runtime.errors import InvalidInputError, require
from runtime.model_files import resolve_model_path
from runtime.models.decoder import head_dim_of

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


@dataclass
class EngineConfig:
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"  # auto: on GPU the checkpoint's 16-bit dtype, else bfloat16; float32 on CPU
    device: str = "auto"  # auto: cuda when available, else cpu
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None  # KV budget; default: every sequence at full length (max_num_seqs x
    # max_model_len), capped at 2 GiB on CPU and on GPU by what gpu_memory_utilization leaves after a profiling step
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # GPU: no CUDA graphs (every decode step launches its kernels one by one)
    seed: int = 0
    attention_backend: str = "auto"  # torch | cpu | triton | flash; auto: flash, else triton on GPU; cpu (the C++
    # kernel) on CPU where it applies, else torch

    hf_config: PretrainedConfig = field(init=False, repr=False)
    model_path: Path = field(init=False)
    torch_dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        self.model_path = resolve_model_path(self.model)
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        if self.tokenizer is None:
            self.tokenizer = str(self.model_path)
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device not in ("cpu", "cuda"):
            raise InvalidInputError("device", f"expected 'auto', 'cpu' or 'cuda', got {self.device!r}")
        self.torch_dtype = self._resolve_dtype()
        limit = self.hf_config.max_position_embeddings
        if self.max_model_len is None:
            self.max_model_len = limit
        require(self.max_model_len >= 2, "max_model_len", "must be at least 2")
        require(self.max_model_len <= limit, "max_model_len",
               f"{self.max_model_len} exceeds the model's max_position_embeddings ({limit})")
        require(self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be at least 1")
        require(self.max_num_seqs >= 1, "max_num_seqs", "must be at least 1")
        require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be at least 1")
        require(self.block_size >= 1, "block_size", "must be at least 1")
        require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]")
        require(self.kv_cache_bytes is None or self.kv_cache_bytes > 0, "kv_cache_bytes", "must be positive")
        try:  # each rank's model runner chooses again, in its own process
            choose_attention_backend(self.attention_backend, self.device, self.torch_dtype, head_dim_of(self.hf_config))
        except ValueError as e:
            raise InvalidInputError("attention_backend", str(e)) from None

    def _resolve_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            if self.device == "cpu":
                return torch.float32
            saved = getattr(self.hf_config, "dtype", None)
            saved = _DTYPES.get(saved, saved) if isinstance(saved, str) else saved
            return saved if saved in (torch.bfloat16, torch.float16) else torch.bfloat16
        if self.dtype not in _DTYPES:
            raise InvalidInputError("dtype", f"expected one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        return _DTYPES[self.dtype]

