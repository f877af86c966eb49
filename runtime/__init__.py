"""The inference engine: continuous batching over a paged, prefix-cached KV cache.

`from runtime import LLM, SamplingParams` is all an offline script needs.
"""

from runtime.async_engine import AsyncLLMEngine, EngineDeadError
from runtime.config import EngineConfig
from runtime.engine import LLMEngine
from runtime.errors import InvalidInputError, RequestFailedError
from runtime.llm import LLM
from runtime.lora import LoRARequest
from runtime.outputs import CompletionOutput, RequestDelta, RequestOutput, SequenceDelta, TokenLogprob
from runtime.sampling_params import SamplingParams
from runtime.validator import ValidRequest

__all__ = [
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
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
