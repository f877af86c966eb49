"""Structured-output constraints compiled with xgrammar, and the per-sequence matcher.

A request carries a `Constraint` (what the client asked for); the engine
compiles it once (xgrammar caches compiled grammars) and gives each sequence
its own matcher, which fills that sequence's row of the batch's token bitmask
and advances with every accepted token.
"""

import json
from dataclasses import dataclass

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from runtime.errors import InvalidInputError

KINDS = ("json_schema", "json_object", "regex", "ebnf", "tool_call")


MAX_CONSTRAINT_CHARS = 32 * 1024  # a schema, regex or grammar longer than this is refused before compiling
CACHE_BYTES = 256 << 20  # compiled grammars kept for reuse, least recently used dropped first


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
    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: set[int]):
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True, cache_limit_bytes=CACHE_BYTES)
        self._vocab_size = vocab_size

        def holding(control: set[int]) -> torch.Tensor:
            ids = [i for i, b in enumerate(info.decoded_vocab) if i not in stop_token_ids and control & set(b)]
            return torch.tensor(ids, dtype=torch.long)

        self._banned = {kind: holding(set(range(32))) for kind in ("json_schema", "json_object")}
        self._banned["tool_call"] = holding(set(range(32)) - {10})  # the call's tags sit on their own lines

    def compile(self, constraint: Constraint) -> Grammar:
        """Compile (or fetch from the cache); a bad schema, regex or grammar, or one that no output can start to
        match (`root ::= root`), raises InvalidInputError."""
        compiled = self._compile(constraint)
        start = xgr.GrammarMatcher(compiled)
        allowed = xgr.allocate_token_bitmask(1, self._vocab_size)
        start.fill_next_token_bitmask(allowed, 0)
        if not allowed.any():
            raise InvalidInputError(constraint.param, f"the {constraint.kind} matches no output at all")
        return Grammar(compiled, self._banned.get(constraint.kind))

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        if constraint.kind not in KINDS:
            raise InvalidInputError(constraint.param, f"unknown constraint {constraint.kind!r}")
        if len(constraint.value) > MAX_CONSTRAINT_CHARS:
            raise InvalidInputError(constraint.param, f"the {constraint.kind} is {len(constraint.value):,} characters; "
                                                      f"at most {MAX_CONSTRAINT_CHARS:,} are compiled")
        try:
            if constraint.kind == "json_schema":
                return self._compiler.compile_json_schema(_schema(constraint), any_whitespace=False)
            if constraint.kind == "json_object":
                return self._compiler.compile_builtin_json_grammar()
            if constraint.kind == "regex":
                return self._compiler.compile_regex(constraint.value)
            if constraint.kind == "ebnf":
                return self._compiler.compile_grammar(constraint.value)
            call = xgr.Grammar.from_json_schema(_schema(constraint), any_whitespace=False)
            return self._compiler.compile_grammar(xgr.Grammar.concat(
                xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), call,
                xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')))
        except InvalidInputError:
            raise
        except Exception as e:  # xgrammar reports bad input with several exception types
            raise InvalidInputError(constraint.param, f"invalid {constraint.kind}: {e}") from None



def _schema(constraint: Constraint) -> str:
    try:
        json.loads(constraint.value)
    except json.JSONDecodeError as e:
        raise InvalidInputError(constraint.param, f"the JSON schema is not valid JSON: {e}") from None
    return constraint.value


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Mask, in place, every token the rows' grammars do not allow next."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
