"""Structured-output constraints compiled with xgrammar, and the per-sequence matcher.

A request carries a `Constraint` (what the client asked for); the engine
compiles it once (compiled grammars are cached) and gives each sequence its
own matcher, which fills that sequence's row of the batch's token bitmask and
advances with every accepted token.

A compile can take minutes and much memory (thousands of optional
properties), and a thread cannot be stopped, so each constraint is first
compiled in a compile process (a fresh interpreter running
runtime/text/grammar_process.py: NUM_PROCESSES of them, one constraint each at a
time), which is killed, returning its CPU and memory, if it overruns its
deadline; only a constraint that compiled there in time is compiled again
here, the same work, so it ends. A new constraint thus costs its compile
twice (a typical schema's: milliseconds). Shipping the compiled grammar back
would cost more: xgrammar serializes it to JSON many times its size, and
reading that back takes longer than the compile (docs/performance.md). A
cached grammar is answered without waiting for any process.
"""

import json
import multiprocessing
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from runtime.errors import InvalidInputError
from runtime.text import grammar_process
from runtime.text.grammar_process import compile_constraint

KINDS = ("json_schema", "json_object", "regex", "ebnf", "tool_call")


MAX_CONSTRAINT_CHARS = 32 * 1024  # a schema, regex or grammar longer than this is refused before compiling
CACHE_BYTES = 256 << 20  # compiled grammars kept for reuse, least recently used dropped first
NUM_PROCESSES = 2  # constraints compiled at once (each on up to 2 threads); more wait for a process
STARTUP_TIMEOUT_S = 300.0  # for a compile process to import xgrammar and read the vocabulary


@dataclass(frozen=True)
class Constraint:
    """What the output must match. `value`: a JSON schema string, a regex, an EBNF grammar, or
    (for `tool_call`) a JSON schema of the call's `{"name", "arguments"}` object."""

    kind: str
    value: str = ""
    param: str = "response_format"  # the request field to name in errors


@dataclass(frozen=True)
class Grammar:
    """A compiled constraint, plus tokens banned outright: for JSON, every token holding a raw control
    byte. Compact JSON never needs one, and xgrammar lets some through inside strings after certain
    byte sequences, which would make the output unparseable."""

    compiled: xgr.CompiledGrammar
    banned: torch.Tensor | None = None


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, grammar: Grammar):
        self._matcher = xgr.GrammarMatcher(grammar.compiled)
        self.banned = grammar.banned

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        self._matcher.accept_token(token_id)

    @property
    def done(self) -> bool:
        return self._matcher.is_terminated()


class GrammarCompiler:
    """Compiles constraints within a deadline (see the module's docstring) and keeps what compiled; thread-safe."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: set[int],
                 isolated: bool = True):
        """`isolated=False`: no compile processes, for an engine whose server compiled every constraint it sends
        within its bound already (runtime.engine.engine_process), so each compiles here in bounded time."""
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._processes = _Processes(info.serialize_json()) if isolated else None
        self._vocab_size = vocab_size
        self._cache: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()

        def holding(control: set[int]) -> torch.Tensor:
            ids = [i for i, b in enumerate(info.decoded_vocab) if i not in stop_token_ids and control & set(b)]
            return torch.tensor(ids, dtype=torch.long)

        self._banned = {kind: holding(set(range(32))) for kind in ("json_schema", "json_object")}
        self._banned["tool_call"] = holding(set(range(32)) - {10})  # the call's tags sit on their own lines

    def cached(self, constraint: Constraint) -> Grammar | None:
        """The grammar compiled before for this constraint, if it is still kept."""
        key = (constraint.kind, constraint.value)
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
            return grammar

    def compile(self, constraint: Constraint, timeout_s: float | None = None) -> Grammar:
        """Compile (or fetch from the cache). A bad schema, regex or grammar, or one that no output can start to
        match (`root ::= root`), raises InvalidInputError; one not compiled within `timeout_s` (waiting for a
        compile process included) raises TimeoutError, its process killed."""
        grammar = self.cached(constraint)
        if grammar is not None:
            return grammar
        _check(constraint)
        if self._processes is None:
            compiled = compile_constraint(self._compiler, constraint.kind, constraint.value)
        else:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            with self._processes.lease(deadline) as process:
                error = process.try_compile(constraint.kind, constraint.value, deadline)
                if error is not None:
                    raise InvalidInputError(constraint.param, f"invalid {constraint.kind}: {error}")
                # it compiled there in time, so the same work ends here
                compiled = compile_constraint(self._compiler, constraint.kind, constraint.value)
        start = xgr.GrammarMatcher(compiled)
        allowed = xgr.allocate_token_bitmask(1, self._vocab_size)
        start.fill_next_token_bitmask(allowed, 0)
        if not allowed.any():
            raise InvalidInputError(constraint.param, f"the {constraint.kind} matches no output at all")
        grammar = Grammar(compiled, self._banned.get(constraint.kind))
        self._keep((constraint.kind, constraint.value), grammar)
        return grammar

    def close(self) -> None:
        """Stop the compile processes."""
        if self._processes is not None:
            self._processes.close()

    def _keep(self, key: tuple[str, str], grammar: Grammar) -> None:
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = grammar
            self._cache_bytes += grammar.compiled.memory_size_bytes
            while self._cache_bytes > CACHE_BYTES and len(self._cache) > 1:
                self._cache_bytes -= self._cache.popitem(last=False)[1].compiled.memory_size_bytes


def _check(constraint: Constraint) -> None:
    """What can be refused before compiling: an unknown kind, a constraint too long, a schema that is not JSON."""
    if constraint.kind not in KINDS:
        raise InvalidInputError(constraint.param, f"unknown constraint {constraint.kind!r}")
    if len(constraint.value) > MAX_CONSTRAINT_CHARS:
        raise InvalidInputError(constraint.param, f"the {constraint.kind} is {len(constraint.value):,} characters; "
                                                  f"at most {MAX_CONSTRAINT_CHARS:,} are compiled")
    if constraint.kind in ("json_schema", "tool_call"):
        try:
            json.loads(constraint.value)
        except json.JSONDecodeError as e:
            raise InvalidInputError(constraint.param, f"the JSON schema is not valid JSON: {e}") from None


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _Process:
    """A compile process, used by one compile at a time: a fresh interpreter. Not a fork of the engine's
    process, whose threads a fork would copy mid-step; not multiprocessing's, which reruns the parent's main
    module in the child (a Ray worker's: all of Ray)."""

    def __init__(self, tokenizer_info_path: str):
        self._conn, child = multiprocessing.Pipe()
        # run as a script, but with its folder kept off sys.path (runtime's modules would shadow others)
        run = f"import runpy; runpy.run_path({grammar_process.__file__!r}, run_name='__main__')"
        self.process = subprocess.Popen([sys.executable, "-c", run, str(child.fileno()), tokenizer_info_path],
                                        pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()

    def wait_ready(self) -> None:
        try:
            ready = self._conn.poll(STARTUP_TIMEOUT_S) and self._conn.recv() is True
        except (OSError, EOFError):
            ready = False
        if not ready:
            self.kill()
            raise ChildProcessError("a grammar compile process did not start")

    def try_compile(self, kind: str, value: str, deadline: float | None) -> str | None:
        """None once the constraint compiled, or the error it raised; TimeoutError, the process killed, when it
        did not finish by `deadline` (starting up included, for a process not waited for); ChildProcessError when
        the process died."""
        if _remaining(deadline) == 0:  # the wait for a process used it all up
            raise TimeoutError(f"the {kind} did not start compiling in time")
        try:
            self._conn.send((kind, value))
            while self._conn.poll(_remaining(deadline)):
                answer = self._conn.recv()
                if answer is not True:  # True: it is ready, and compiles next
                    return answer
        except (OSError, EOFError):
            self.kill()
            raise ChildProcessError("the grammar compile process died") from None
        self.kill()
        raise TimeoutError(f"the {kind} did not compile in time")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._conn.close()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class _Processes:
    """NUM_PROCESSES compile processes, each leased to one compile at a time; one killed is replaced at once.
    They read the tokenizer's vocabulary from a file, and are killed when the engine shuts down or exits."""

    def __init__(self, tokenizer_info: str):
        fd, self._info_path = tempfile.mkstemp(prefix="grammar-tokenizer-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(tokenizer_info)
        self._idle: queue.SimpleQueue[_Process] = queue.SimpleQueue()
        self.close = weakref.finalize(self, _stop, self._idle, self._info_path)
        started = [_Process(self._info_path) for _ in range(NUM_PROCESSES)]
        for process in started:
            process.wait_ready()  # the first compiles' deadlines do not pay for starting up
            self._idle.put(process)

    @contextmanager
    def lease(self, deadline: float | None) -> Iterator[_Process]:
        """An idle process, for the caller alone until it returns (TimeoutError if none is free by `deadline`)."""
        try:
            process = self._idle.get(timeout=_remaining(deadline))
        except queue.Empty:
            raise TimeoutError("no grammar compile process was free in time") from None
        try:
            yield process
        finally:
            if not self.close.alive:  # closed meanwhile
                process.kill()
            else:
                self._idle.put(process if process.alive else _Process(self._info_path))


def _stop(idle: queue.SimpleQueue, info_path: str) -> None:
    """Kill the idle compile processes (a leased one is killed when it comes back) and remove the vocabulary."""
    while True:
        try:
            idle.get_nowait().kill()
        except queue.Empty:
            break
    os.unlink(info_path)


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Mask, in place, every token the rows' grammars do not allow next."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
