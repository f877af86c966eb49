"""What an engine's driver asks of the thread or process that steps it (runtime.engine.async_engine,
runtime.engine.engine_process): requests added and aborted, shared-tier blocks imported, lifecycle operations,
its stats and its stop. Commands are queued and applied between two steps, in order."""

import concurrent.futures
from dataclasses import dataclass

from runtime.engine.validator import ValidRequest


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    valid: ValidRequest
    priority: int = 0
    owner: str | None = None  # an API key's digest: who the engine shares its seats among
    stream: bool = True


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True, slots=True)
class ImportBlocks:
    """Blocks from the shared tier (runtime.kv_tier.shared.FetchedBlocks), queued before the request that wants
    them."""

    fetched: object


@dataclass(frozen=True, slots=True)
class RunLifecycle:
    """One of runtime.engine.lifecycle's operations; `done`, where the caller waits on one, gets its outcome."""

    operation: str
    args: tuple
    done: concurrent.futures.Future | None = None


@dataclass(frozen=True, slots=True)
class ReadStats:
    pass


@dataclass(frozen=True, slots=True)
class ReadPrefixMarks:
    pass


@dataclass(frozen=True, slots=True)
class ReadCachedTokens:
    """How much of a prompt the engine's cache holds (`LLMEngine.cached_prompt_tokens`)."""

    valid: ValidRequest


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = AddRequest | AbortRequest | ImportBlocks | RunLifecycle
# an engine process's control channel: each gets its answer
Question = RunLifecycle | ReadStats | ReadPrefixMarks | ReadCachedTokens | Stop
