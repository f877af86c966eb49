"""The engine in a process of its own, stepped for a server that keeps its Python work to itself.

In one process, a server's Python (its event loop, Ray's threads, chat templates, tokenizing, building
responses) and the engine's stepping take turns on one interpreter lock, so every step waits for theirs: a
CPU replica answering a batch steps markedly slower than the same engine alone, on the same requests.
With `engine_process`, `AsyncLLMEngine` runs the engine here instead: a fresh interpreter (not a fork of the
server, whose threads a fork would copy; not multiprocessing's spawn, which reruns the parent's main module,
a Ray worker's) builds the `LLMEngine` and steps it. The server validates requests with a `RequestValidator`
of its own (the model's spec and tokenizer, no weights) and sends them; each step's deltas that are due come
back as one message (runtime.engine.delivery holds back the rest): a 16-token answer crosses the pipe in three or
four deltas, not sixteen. Stats, what the cache holds and health are asked on a second pipe, answered between steps.

`EngineProcess` is what `AsyncLLMEngine`'s loop thread steps in place of an `LLMEngine`: `enqueue` and
`abort` are sent at once, from whatever thread calls them (the child applies them between its steps), and
`step` returns the deltas of every step the child ran since the last.
The child exits when asked, or when the server's end of its pipes closes: the server died, however it died.
"""

import os
import pickle
import queue
import subprocess
import sys
import threading
from dataclasses import replace
from multiprocessing.connection import Connection, Pipe, wait

import torch

from runtime.config import EngineConfig
from runtime.engine.commands import (
    AbortRequest,
    AddRequest,
    Question,
    ReadCachedTokens,
    ReadPrefixMarks,
    ReadStats,
    RunLifecycle,
    Stop,
)
from runtime.engine.delivery import DeliverySchedule
from runtime.engine.startup_heap import freeze_startup_heap
from runtime.engine.validator import RequestValidator, ValidRequest
from runtime.errors import InvalidInputError, describe
from runtime.outputs import RequestDelta

STARTUP_TIMEOUT_S = 600  # the child loads the weights (and on a GPU, profiles memory) before it answers
# command messages the child applies between two steps: all that came in a step, as a rule (each holds every
# command waiting when it was sent), but a burst of adds that compile grammars cannot hold the steps up
COMMAND_MESSAGES_PER_STEP = 16


class ValueConnection:
    """A pipe end whose messages are pickled by value. A `Connection` pickles with multiprocessing's pickler, which
    carries torch's reductions once `torch.multiprocessing` is imported (Ray imports it): a tensor (a picture's
    pixels, an encoder's rows, new weights) would cross as a shared-memory handle that only a multiprocessing child
    can open, and the engine's process is not one."""

    def __init__(self, connection: Connection):
        self.connection = connection

    def send(self, message) -> None:
        self.connection.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def recv(self):
        return pickle.loads(self.connection.recv_bytes())

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self.connection.poll(timeout)

    def fileno(self) -> int:  # what `multiprocessing.connection.wait` waits on
        return self.connection.fileno()


def engine_threads(cpus: int) -> int:
    """The child's torch threads on CPU: a quarter of the replica's cores, rounded down, is left to the server's
    own Python, Ray's processes and the OS. Every step ends in a barrier of all its threads, so one thread that
    loses its core holds up the rest; below four cores the server's share is less than a core, and the engine
    takes them all (docs/performance.md has the figures)."""
    return max(1, cpus - cpus // 4)


class EngineProcess:
    def __init__(self, config: EngineConfig, delivery_interval_s: float = 0.0):
        self.config = config
        self.validator = RequestValidator(config)
        self.spec, self.tokenizer = self.validator.spec, self.validator.tokenizer
        steps, steps_child = Pipe()
        control, control_child = Pipe()
        self._steps, self._control = ValueConnection(steps), ValueConnection(control)
        self._control_lock = threading.Lock()
        self._unfinished: set[str] = set()
        self._held = False  # the child is paused or asleep: it runs no step
        # commands go out on a thread of their own, so the loop thread reads steps while a big send waits for the
        # child to read it: both sides blocked on a full pipe would be a deadlock
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        if config.device == "cpu":
            env["OMP_NUM_THREADS"] = str(engine_threads(torch.get_num_threads()))
        run = "from runtime.engine.engine_process import main; main()"
        fds = [steps_child.fileno(), control_child.fileno()]
        self.process = subprocess.Popen([sys.executable, "-c", run, *map(str, fds)], pass_fds=fds, env=env,
                                        stdin=subprocess.DEVNULL)
        steps_child.close()
        control_child.close()
        self._control.send((config, delivery_interval_s))
        if not self._control.poll(STARTUP_TIMEOUT_S):
            self.process.kill()
            raise RuntimeError("the engine process did not start")
        error = self._control.recv()
        if error is not None:
            self.process.wait()
            raise error
        threading.Thread(target=self._send_commands, name="engine-commands", daemon=True).start()

    # --- what AsyncLLMEngine calls: enqueue and abort on any thread, the rest on its loop thread ---------

    def enqueue(self, request_id: str, valid: ValidRequest, priority: int = 0, owner: str | None = None,
                stream: bool = True) -> None:
        if request_id in self._unfinished:
            raise InvalidInputError("request_id", f"{request_id!r} is already in flight")
        # a compiled grammar stays here (shipping it costs more than compiling it again): the child compiles it,
        # in its own process, as this one's compile processes showed it compiles in time
        self._unfinished.add(request_id)
        self._outbox.put(AddRequest(request_id, replace(valid, grammar=None), priority, owner, stream))

    def abort(self, request_id: str) -> None:
        if request_id in self._unfinished:
            self._unfinished.discard(request_id)
            self._outbox.put(AbortRequest(request_id))

    def has_unfinished_requests(self) -> bool:
        return bool(self._unfinished)

    @property
    def runnable(self) -> bool:
        """Whether the child steps: requests in flight, and neither paused nor asleep."""
        return bool(self._unfinished) and not self._held

    def lifecycle(self, operation: str, *args) -> list[RequestDelta]:
        """Run a lifecycle operation (runtime.engine.lifecycle) in the child, between its steps; the deltas of the
        requests it ended."""
        answer = self._ask(RunLifecycle(operation, args))
        if isinstance(answer, Exception):
            raise answer
        deltas, paused, asleep = answer
        self._held = paused or asleep
        for delta in deltas:
            if delta.finished:
                self._unfinished.discard(delta.request_id)
        return deltas

    def step(self) -> list[RequestDelta]:
        """The deltas of the steps the child ran since the last call (at least one)."""
        deltas = []
        while True:
            kind, payload = self._steps.recv()
            if kind == "dead":
                raise RuntimeError(payload)
            deltas += payload
            if not self._steps.poll():
                break
        for delta in deltas:
            if delta.finished:
                self._unfinished.discard(delta.request_id)
        return deltas

    def _send_commands(self) -> None:
        """Send the queued commands, all those waiting as one message, until shutdown queues None."""
        while (command := self._outbox.get()) is not None:
            commands = [command]
            while not self._outbox.empty():
                commands.append(self._outbox.get())
            if None in commands:  # shutting down: what was queued no longer matters
                return
            try:
                self._steps.send(commands)
            except OSError:  # the child is gone: the loop thread's next read says so
                return

    # --- any thread -------------------------------------------------------------

    def stats(self) -> dict:
        return self._ask(ReadStats())

    def cached_prompt_tokens(self, valid: ValidRequest) -> int:
        """Asked of the engine's process, the pictures' tensors left out (their content hashes name them)."""
        images = tuple(replace(image, tensors={}, encoded=None) for image in valid.images)
        return self._ask(ReadCachedTokens(replace(valid, grammar=None, images=images)))

    def held_prefix_marks(self) -> list[int]:
        return self._ask(ReadPrefixMarks())

    def healthy(self) -> bool:
        return self.process.poll() is None

    def shutdown(self) -> None:
        self._outbox.put(None)
        try:
            self._ask(Stop())
        except (OSError, EOFError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.validator.close()

    def _ask(self, question: Question):
        with self._control_lock:
            self._control.send(question)
            return self._control.recv()


# --- the child ---------------------------------------------------------------------


def main() -> None:
    steps, control = (ValueConnection(Connection(int(fd))) for fd in sys.argv[1:3])
    from runtime.engine.llm_engine import LLMEngine

    try:
        config, delivery_interval_s = control.recv()
        engine = LLMEngine(config, isolate_grammars=False)  # the server compiled each within its bound
    except BaseException as e:
        control.send(e if isinstance(e, InvalidInputError) else RuntimeError(f"the engine did not start: {e!r}"))
        return
    freeze_startup_heap()
    control.send(None)
    try:
        _serve(engine, DeliverySchedule(delivery_interval_s), steps, control)
    except (EOFError, OSError):  # the server is gone
        pass
    finally:
        engine.shutdown()


def _serve(engine, schedule: DeliverySchedule, steps: ValueConnection, control: ValueConnection) -> None:
    while True:
        ready = wait([steps, control], timeout=None if not engine.runnable else 0)
        if control in ready:
            match control.recv():
                case Stop():
                    control.send(None)
                    return
                case ReadStats():
                    control.send(engine.stats())
                case ReadPrefixMarks():
                    control.send(engine.held_prefix_marks())
                case ReadCachedTokens(valid):
                    control.send(engine.cached_prompt_tokens(valid))
                case RunLifecycle(operation, args):
                    control.send(_lifecycle(engine, schedule, operation, args))
                    steps.send(("step", []))  # a server thread waiting for a step may now wait for none
        received, refused = 0, []
        while received < COMMAND_MESSAGES_PER_STEP and steps.poll():  # the commands sent so far, bounded
            received += 1
            refused += [_apply(engine, schedule, command) for command in steps.recv()]
        refused = [delta for delta in refused if delta is not None]
        if refused or (received and not engine.has_unfinished_requests()):
            # a request refused, or none left (aborted before it ran): the server may be waiting for a step
            steps.send(("step", refused))
        if engine.runnable:
            try:
                deltas = engine.step()
            except BaseException as e:
                steps.send(("dead", f"engine step failed: {e!r}"))
                raise
            steps.send(("step", schedule.due(deltas)))  # every step, so the server's reads never wait long


def _lifecycle(engine, schedule: DeliverySchedule, operation: str, args: tuple):
    """The answer to a lifecycle question: the deltas due and whether the engine is paused and asleep after it, or
    what it raised."""
    try:
        deltas = schedule.due(getattr(engine, operation)(*args))
    except Exception as e:
        return e if isinstance(e, InvalidInputError) else RuntimeError(f"{operation} failed: {e!r}")
    return deltas, engine.paused, engine.asleep


def _apply(engine, schedule: DeliverySchedule, command: AddRequest | AbortRequest) -> RequestDelta | None:
    """Apply a command; a request the engine refused gets its final delta, with the error."""
    match command:
        case AbortRequest(request_id):
            engine.abort(request_id)
            schedule.forget(request_id)
        case AddRequest(request_id, valid, priority, owner, stream):
            try:
                engine.enqueue(request_id, valid, priority, owner, stream)
            except Exception as e:  # the server checked the request: what fails here fails it alone
                return RequestDelta(request_id, len(valid.prompt_token_ids), 0, [], True, error=describe(e))
            schedule.start(request_id, stream, owner)
    return None
