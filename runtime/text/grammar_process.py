"""A grammar compile process (see runtime.text.grammar): compiles each constraint it is sent and answers whether it
compiled. Run as a script, so it imports xgrammar and nothing of the engine."""

import sys
from multiprocessing.connection import Connection

import xgrammar as xgr


def compile_constraint(compiler: xgr.GrammarCompiler, kind: str, value: str) -> xgr.CompiledGrammar:
    """A checked constraint (runtime.text.grammar.Constraint's kind and value) compiled; xgrammar raises on bad input
    (several exception types)."""
    if kind == "json_schema":
        return compiler.compile_json_schema(value, any_whitespace=False)
    if kind == "json_object":  # JSON mode: an object, as OpenAI's and vLLM's (xgrammar's builtin takes any value)
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
    if kind == "regex":
        return compiler.compile_regex(value)
    if kind == "ebnf":
        return compiler.compile_grammar(value)
    call = xgr.Grammar.from_json_schema(value, any_whitespace=False)
    return compiler.compile_grammar(xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), call, xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')))


def serve(fd: int, tokenizer_info_path: str) -> None:
    """Say it is ready (True), then compile each (kind, value) sent on `fd` and answer None, or the error's text."""
    conn = Connection(fd)
    with open(tokenizer_info_path) as f:
        info = xgr.TokenizerInfo.deserialize_json(f.read())
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    conn.send(True)
    while True:
        try:
            kind, value = conn.recv()
        except EOFError:  # the engine closed its end (or ended)
            return
        try:
            compile_constraint(compiler, kind, value)
            conn.send(None)
        except Exception as e:
            conn.send(str(e) or type(e).__name__)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
