"""The engine behind a server: one background thread steps the engine while
asyncio callers stream their requests' deltas.

The thread also builds the engine, so every torch op in this process runs on
one native thread. libgomp gives each thread that runs a parallel region its
own team of workers; a second team oversubscribes the cores, which makes libgomp
put idle workers to sleep at once, and every small op then pays a wake-up (a
decode step takes markedly longer when the model was loaded on another thread).

With the engine option `engine_process`, the thread steps an `EngineProcess`
instead: the same interface, the engine itself in a child process
(runtime.engine.engine_process), so the server's Python never holds up a step.

Commands (add, abort) are queued to the thread and applied between steps, so
the engine itself is only ever touched by its thread (an engine process takes
them at once, on any thread, and its child applies them between its steps).
The step's token deltas get their text on a second thread (runtime.engine.text_stage),
so the engine's thread goes on to the next step meanwhile (on a GPU, the host
work while the device computes); it waits only for the text of the step before,
so a sequence ends at most a step after its stop string. An engine process
gives its deltas their text in its child.
Each request's deltas go to an asyncio queue on the caller's loop, at most
once per `delivery_interval_s` (runtime.engine.delivery; with `engine_process`, the
child holds them back, so they never cross the pipe), with one wake-up per
loop per step. Leaving the iterator early (a client disconnect, a cancelled
task) aborts the request and frees its blocks.
"""

import asyncio
import concurrent.futures
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from runtime.config import EngineConfig
from runtime.engine.commands import AbortRequest, AddRequest, Command, ImportBlocks, RunLifecycle
from runtime.engine.delivery import DeliverySchedule
from runtime.engine.engine_process import EngineProcess
from runtime.engine.lifecycle import LIFECYCLE
from runtime.engine.llm_engine import LLMEngine
from runtime.engine.validator import RequestValidator, ValidRequest
from runtime.errors import InvalidInputError, RequestFailedError
from runtime.lora import LoRARequest
from runtime.outputs import RequestDelta
from runtime.pooling import PoolerConfig
from runtime.sampling_params import SamplingParams
from runtime.text.harmony_chat import uses_harmony

GRAMMAR_TIMEOUT_S = 20.0
# threads that wait for grammar compile processes (runtime.text.grammar bounds how many compile at once)
_grammar_waiters = ThreadPoolExecutor(max_workers=16, thread_name_prefix="grammar")


class EngineDeadError(RuntimeError):
    """The engine loop failed; requests in flight were failed with the cause."""


@dataclass
class _Stream:
    """Where a request's deltas go."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class StreamObserver(Protocol):
    """Sees each request's stream from its caller's side (metrics do): its start, every delta it yields, its end
    (finished, failed or left)."""

    def started(self, request_id: str) -> None: ...

    def delta(self, request_id: str, delta: RequestDelta) -> None: ...

    def ended(self, request_id: str) -> None: ...


class AsyncLLMEngine:
    def __init__(self, build_engine: Callable[[], LLMEngine], delivery_interval_s: float = 0.0,
                 observer: StreamObserver | None = None):
        """Start the engine thread, which calls `build_engine`; raises what building raised."""
        self._schedule = DeliverySchedule(delivery_interval_s)
        self.observer = observer
        self._commands: list[Command] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stopped = False
        self.error: BaseException | None = None
        self.died = threading.Event()  # set once a step has failed and the engine stopped serving (`error` says why)
        # steps' records to give text to, and aborted request ids to forget, in order; None ends the text thread
        self._texts: queue.Queue[list | str | None] = queue.Queue()
        self._text_slot = threading.Semaphore(1)  # one step's records waiting for (or getting) their text at most
        built: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(build_engine, built), name="engine-loop",
                                        daemon=True)
        self._thread.start()
        built.result()  # the thread has set self.engine
        # an engine process takes commands at once, from any thread: they reach its child while this thread
        # waits for its next step (an online request does not wait a step for its add to leave)
        self._commands_at_once = isinstance(self.engine, EngineProcess)
        self._text_thread = None
        if not self._commands_at_once:
            self._text_thread = threading.Thread(target=self._write_text, name="engine-text", daemon=True)
            self._text_thread.start()

    @classmethod
    def from_options(cls, model: str, delivery_interval_s: float = 0.0, observer: StreamObserver | None = None,
                     **engine_kwargs) -> "AsyncLLMEngine":
        """With the option `engine_process`, the engine steps in a process of its own (runtime.engine.engine_process),
        which holds back its deltas itself."""
        config = EngineConfig(model=model, **engine_kwargs)
        if config.engine_process:
            return cls(lambda: EngineProcess(config, delivery_interval_s), 0.0, observer)
        return cls(lambda: LLMEngine(config), delivery_interval_s, observer)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.engine.validator.encode(text, add_special_tokens)

    @property
    def harmony(self) -> bool:
        """The model chats in gpt-oss's harmony format rather than through its chat template."""
        return uses_harmony(self.engine.spec.hf_config)

    @property
    def max_model_len(self) -> int:
        return self.engine.spec.max_model_len

    @property
    def quantization(self) -> str | None:
        """The checkpoint's quantization, as /v1/models names it ("compressed-tensors (w4a16)"), or None."""
        quantization = self.engine.spec.quantization
        return None if quantization is None else quantization.label

    @property
    def architecture(self) -> str:
        """The checkpoint's architecture as the engine runs it (`Qwen3NextForCausalLM`)."""
        return self.engine.spec.model_class.__name__

    @property
    def runner(self) -> str:
        """What the model serves: generate or pooling (embeddings, or a classifier's scores)."""
        return self.engine.config.runner

    @property
    def pooler(self) -> PoolerConfig:
        return self.engine.validator.pooler

    @property
    def embedding_size(self) -> int:
        return self.engine.spec.pooled_size

    @property
    def labels(self) -> list[str] | None:
        """A classifier's label names, in its logits' order; None for a model that does not classify."""
        return self.engine.spec.labels

    @property
    def healthy(self) -> bool:
        """The loop runs and no step has failed (cheap; see `check_health` for the workers too)."""
        return self.error is None and self._thread.is_alive()

    def check_health(self) -> bool:
        """`healthy`, and every tensor-parallel worker answers (blocks up to a few seconds)."""
        return self.healthy and self.engine.healthy()

    @property
    def validator(self) -> RequestValidator:
        """What checks requests (pictures too: `process_images`), on the caller's thread."""
        return self.engine.validator

    def validate(self, prompt_token_ids: list[int], params: SamplingParams,
                 lora: LoRARequest | None = None, images: tuple = ()) -> ValidRequest:
        """The request checked against the model (`InvalidInputError` if it is bad), ready for `generate`; a
        LoRA adapter is read here, on the caller's thread."""
        return self.engine.validator.validate(prompt_token_ids, params, lora, images)

    def validate_embedding(self, prompt_token_ids: list[int], lora: LoRARequest | None = None) -> ValidRequest:
        """An embedding request checked against the model (`InvalidInputError` if it is bad), ready for `embed`."""
        return self.engine.validator.validate_embedding(prompt_token_ids, lora)

    async def embed(self, request: ValidRequest, request_id: str | None = None, priority: int = 0,
                    owner: str | None = None) -> RequestDelta:
        """Run a validated embedding request; its one delta, with the embedding and the prompt's token count."""
        last = None
        async for last in self.generate(request, request_id, priority, owner):
            pass  # one delta: the request finishes in the step that computes its last prompt token
        return last

    async def generate(self, request: ValidRequest, request_id: str | None = None, priority: int = 0,
                       owner: str | None = None, stream: bool = True) -> AsyncIterator[RequestDelta]:
        """Stream a validated request's deltas until it finishes. `owner` (an API key's digest, a tenant; None:
        anonymous) is who the engine shares its seats fairly among. `stream` False: the caller reads only the
        whole answer, which then comes in two deltas (runtime.engine.delivery)."""
        if not self.healthy:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        request = await self.compile(request)
        if getattr(self.engine, "shared_tier", None) is not None:  # off the loop and the engine's thread
            fetched = await asyncio.to_thread(self.engine.fetch_shared, request)
            if fetched is not None:
                self._send(ImportBlocks(fetched))
        request_id = request_id or f"req-{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = _Stream(asyncio.get_running_loop(), queue)
        self._send(AddRequest(request_id, request, priority, owner, stream))
        if self.observer is not None:
            self.observer.started(request_id)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                if item.error is not None:
                    raise RequestFailedError(item.error)
                if self.observer is not None:
                    self.observer.delta(request_id, item)
                yield item
        finally:
            self._streams.pop(request_id, None)
            if self.observer is not None:
                self.observer.ended(request_id)
            if not finished:
                self.abort(request_id)

    async def compile(self, request: ValidRequest) -> ValidRequest:
        """The request with its structured-output grammar compiled (a bad one raises `InvalidInputError`), so a
        server can refuse it before its response starts; `generate` does it for a request that comes without.

        A cached grammar is taken at once. Others compile off the engine loop, in compile processes of their own
        (so they queue there and nothing else waits behind them), within GRAMMAR_TIMEOUT_S: one that overruns
        is killed, returning its CPU and memory, and the request is refused."""
        constraint = request.params.structured_output
        if constraint is None or request.grammar is not None:
            return request
        grammar = self.engine.validator.cached_grammar(constraint)
        if grammar is None:
            work = asyncio.get_running_loop().run_in_executor(_grammar_waiters, self.engine.validator.compile_grammar,
                                                              constraint, GRAMMAR_TIMEOUT_S)
            try:
                grammar = await work
            except TimeoutError:
                raise InvalidInputError(constraint.param, f"the {constraint.kind} did not compile within "
                                                          f"{GRAMMAR_TIMEOUT_S:g} s; simplify it") from None
            except ChildProcessError:  # its compile process died (out of memory, say): this grammar's doing
                raise InvalidInputError(constraint.param, f"the {constraint.kind} could not be compiled (its "
                                                          "compile process died); simplify it") from None
        return replace(request, grammar=grammar)

    def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    async def lifecycle(self, operation: str, *args) -> None:
        """Run one of runtime.engine.lifecycle's operations (pause, resume, reset_prefix_cache, update_weights,
        sleep, wake_up) on the engine between two steps; the requests it ends get their last delta. Raises what
        the operation raised (`InvalidInputError` for a bad argument)."""
        if operation not in LIFECYCLE:
            raise InvalidInputError("operation", f"not one of {LIFECYCLE}")
        if self._commands_at_once:  # an engine process: its child runs it between its steps
            self._deliver_step(await asyncio.to_thread(self.engine.lifecycle, operation, *args))
        else:
            done: concurrent.futures.Future = concurrent.futures.Future()
            self._send(RunLifecycle(operation, args, done))
            await asyncio.wrap_future(done)
        self._wake.set()  # resumed or woken up: the loop may have steps to run

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._texts.put(None)
        self._thread.join(timeout=10)
        self.engine.shutdown()

    def stats(self) -> dict:
        return self.engine.stats()

    # --- the engine thread ----------------------------------------------------

    def _send(self, command: Command) -> None:
        if self._commands_at_once:
            self._apply(command)
        else:
            with self._lock:
                self._commands.append(command)
        self._wake.set()

    def _run(self, build_engine: Callable[[], LLMEngine], built: concurrent.futures.Future) -> None:
        try:
            self.engine = build_engine()
        except BaseException as e:
            built.set_exception(e)
            return
        built.set_result(None)
        while not self._stopped:
            self._apply_commands()
            if not self.engine.runnable:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                if self._text_thread is None:  # an engine process: its deltas come with their text
                    self._deliver_step(self.engine.step())
                else:
                    deltas = self.engine.step_tokens()
                    self._text_slot.acquire()
                    self._texts.put(deltas)
            except BaseException as e:  # the engine is broken: fail everyone, stop serving
                self._die(e, "engine step failed")
                return

    def _die(self, error: BaseException, what: str) -> None:
        self.error = error
        self._stopped = True
        self._wake.set()
        self._fail_all(EngineDeadError(f"{what}: {error!r}"))
        self.died.set()

    def _write_text(self) -> None:
        """The text thread: each step's deltas with their text, delivered; the ids of aborted requests forgotten."""
        while (item := self._texts.get()) is not None:
            try:
                if isinstance(item, str):
                    self._schedule.forget(item)
                else:
                    self._deliver_step(self.engine.text.apply(item))
            except BaseException as e:  # not one request's (those fail alone): nothing would be delivered again
                self._die(e, "the text stage failed")
            finally:
                if not isinstance(item, str):
                    self._text_slot.release()
                self._texts.task_done()

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for command in commands:
            self._apply(command)

    def _apply(self, command: Command) -> None:
        match command:
            case ImportBlocks(fetched):
                self.engine.import_blocks(fetched)
            case RunLifecycle(operation, args, done):
                self._texts.join()  # the text stage is the operation's own while it runs
                try:
                    self._deliver_step(getattr(self.engine, operation)(*args))
                except Exception as e:
                    done.set_exception(e)
                else:
                    done.set_result(None)
            case AbortRequest(request_id):
                self.engine.abort(request_id)
                if self._text_thread is None:
                    self._schedule.forget(request_id)
                else:
                    self._texts.put(request_id)  # held deltas are the text thread's to forget
            case AddRequest(request_id, valid, priority, owner, stream):
                try:
                    self.engine.enqueue(request_id, valid, priority, owner, stream)
                    if not self._commands_at_once:  # (an engine process: its child holds back the deltas)
                        self._schedule.start(request_id, stream, owner)
                except Exception as e:
                    self._deliver(request_id, e)

    def _deliver_step(self, deltas: list[RequestDelta]) -> None:
        """Queue a step's deltas that are due, one wake-up per caller's loop."""
        due: dict[asyncio.AbstractEventLoop, list] = {}
        for delta in self._schedule.due(deltas):
            stream = self._streams.get(delta.request_id)
            if stream is not None:
                due.setdefault(stream.loop, []).append((stream.queue, delta))
        for loop, items in due.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._streams):
            self._deliver(request_id, error)


def _put_all(items: list[tuple[asyncio.Queue, RequestDelta]]) -> None:
    for stream_queue, delta in items:
        stream_queue.put_nowait(delta)
