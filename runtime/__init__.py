"""The inference engine: continuous batching over a paged, prefix-cached KV cache.

`from runtime import LLM, SamplingParams` is all an offline script needs.
"""

import runtime.openmp_env  # noqa: F401  (first: it sets libgomp's environment before torch loads it)
from runtime.config import EngineConfig
from runtime.engine.async_engine import AsyncLLMEngine, EngineDeadError
from runtime.engine.llm import LLM
from runtime.engine.llm_engine import LLMEngine
from runtime.engine.validator import ValidRequest
from runtime.errors import ContextLengthError, InvalidInputError, RequestFailedError
from runtime.lora import LoRARequest
from runtime.outputs import CompletionOutput, RequestDelta, RequestOutput, SequenceDelta, TokenLogprob
from runtime.sampling_params import SamplingParams

__all__ = [
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
    "ContextLengthError",
    "InvalidInputError",
    "LLM",
    "LLMEngine",
    "LoRARequest",
    "RequestDelta",
    "RequestFailedError",
    "RequestOutput",
    "SamplingParams",
    "SequenceDelta",
    "TokenLogprob",
    "ValidRequest",
]
