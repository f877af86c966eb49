"""Structured-output constraints compiled with xgrammar, and the per-sequence matcher.

A request carries a `Constraint` (what the client asked for); the engine
compiles it once (compiled grammars are cached) and gives each sequence its
own matcher, which fills that sequence's row of the batch's token bitmask and
advances with every accepted token.

A compile can take minutes and much memory (thousands of optional
properties), and a thread cannot be stopped, so each constraint is first
compiled in a compile process, which is killed (returning its CPU and memory)
if it overruns its deadline; only a constraint that compiled there in time is
compiled again here, the same work, so it ends. Shipping the compiled grammar
back instead would cost more than compiling it twice: xgrammar serializes it
to JSON some fifty times its size, and reading that back took six times as
long as the compile. A cached grammar is answered without waiting for any
process.
"""

import json
import multiprocessing
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from runtime.errors import InvalidInputError

KINDS = ("json_schema", "json_object", "regex", "ebnf", "tool_call")


MAX_CONSTRAINT_CHARS = 32 * 1024  # a schema, regex or grammar longer than this is refused before compiling
CACHE_BYTES = 256 << 20  # compiled grammars kept for reuse, least recently used dropped first
NUM_PROCESSES = 2  # constraints compiled at once (each on up to 2 threads); more wait for a process


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

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: set[int]):
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._processes = _Processes(info.serialize_json())
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
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._processes.lease(deadline) as process:
            error = process.try_compile(constraint.kind, constraint.value, deadline)
            if error is not None:
                raise InvalidInputError(constraint.param, f"invalid {constraint.kind}: {error}")
            compiled = _compile(self._compiler, constraint.kind, constraint.value)  # it ended there: it ends here
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


def _compile(compiler: xgr.GrammarCompiler, kind: str, value: str) -> xgr.CompiledGrammar:
    """A checked constraint compiled; xgrammar raises on bad input (several exception types)."""
    if kind == "json_schema":
        return compiler.compile_json_schema(value, any_whitespace=False)
    if kind == "json_object":
        return compiler.compile_builtin_json_grammar()
    if kind == "regex":
        return compiler.compile_regex(value)
    if kind == "ebnf":
        return compiler.compile_grammar(value)
    call = xgr.Grammar.from_json_schema(value, any_whitespace=False)
    return compiler.compile_grammar(xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), call, xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')))


def _serve(conn, tokenizer_info: str) -> None:
    """A compile process's loop: compile each (kind, value) it is sent; answer None, or the error's text."""
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(tokenizer_info), max_threads=2,
                                   cache_enabled=False)
    while True:
        try:
            kind, value = conn.recv()
        except EOFError:  # the engine closed its end
            return
        try:
            _compile(compiler, kind, value)
            conn.send(None)
        except Exception as e:
            conn.send(str(e) or type(e).__name__)


class _Process:
    """A compile process, used by one compile at a time. Forked from multiprocessing's fork server (which has
    this module loaded), not from the engine's process, whose threads a fork would copy mid-step."""

    def __init__(self, tokenizer_info: str):
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, tokenizer_info), name="grammar-compile",
                                       daemon=True)
        self.process.start()
        child.close()

    def try_compile(self, kind: str, value: str, deadline: float | None) -> str | None:
        """None once the constraint compiled, or the error it raised; TimeoutError, the process killed, when it
        did not finish by `deadline`."""
        self._conn.send((kind, value))
        if self._conn.poll(None if deadline is None else max(0.0, deadline - time.monotonic())):
            try:
                return self._conn.recv()
            except EOFError:
                self.kill()
                return "its compile process died"
        self.kill()
        raise TimeoutError(f"the {kind} did not compile in time")

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self._conn.close()

    @property
    def alive(self) -> bool:
        return self.process.is_alive()


class _Processes:
    """NUM_PROCESSES compile processes, each leased to one compile at a time; one killed is replaced at once."""

    def __init__(self, tokenizer_info: str):
        self._info = tokenizer_info
        self._idle: queue.SimpleQueue[_Process] = queue.SimpleQueue()
        for _ in range(NUM_PROCESSES):
            self._idle.put(_Process(tokenizer_info))
        self._closed = False

    @contextmanager
    def lease(self, deadline: float | None) -> Iterator[_Process]:
        """An idle process, for the caller alone until it returns (TimeoutError if none is free by `deadline`)."""
        try:
            process = self._idle.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("no grammar compile process was free in time") from None
        try:
            yield process
        finally:
            if self._closed:
                process.kill()
            else:
                self._idle.put(process if process.alive else _Process(self._info))

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Mask, in place, every token the rows' grammars do not allow next."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
