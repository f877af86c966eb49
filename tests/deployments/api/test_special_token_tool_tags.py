"""Tool calls whose tags are special tokens, as DeepSeek's, Kimi's, MiniMax's, GLM's, Llama's and Mistral's
tokenizers mark them: each format's calls, generated one token a step, pass through the engine's incremental
detokenizer with skip_special_tokens off (what the chat route asks for a tool format) into the format's parser
and read back as the calls; decoded with special tokens skipped, as any other request is, they are lost (but
where a format reads its calls without their tag)."""

import json

import pytest

from deployments.parsers import TOOL_CALL_FORMATS, tool_call_parser
from runtime.text.detokenizer import IncrementalDetokenizer
from testing.model_factory import build_tokenizer
from tests.deployments.api.test_tool_call_formats import ALIASES, CALLS, CONTENT, SCHEMAS, WHOLE, WRITTEN

SPECIAL_TAGS = [
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",  # Hermes, Qwen, GLM
    "<minimax:tool_call>", "</minimax:tool_call>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<|python_tag|>", "<|python_start|>", "<|python_end|>", "[TOOL_CALLS]", "[ARGS]",
]
# (format, its content, its calls as written): those whose tags are among SPECIAL_TAGS; a format whose calls are
# the whole output writes no content before them
EXAMPLES = [(name, CONTENT, text) for name, text in WRITTEN.items()] + \
    [(name, "", text) for name, text in WHOLE if any(tag in text for tag in SPECIAL_TAGS)]

TAG_OPTIONAL = {"llama3_json", "pythonic"}  # a whole output that is calls reads as calls without their tag too


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = build_tokenizer(512)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TAGS})
    return tokenizer


def stream(tokenizer, name: str, text: str, skip_special_tokens: bool) -> tuple[str, list]:
    """The content and calls of `text` generated token by token, decoded and parsed as the chat route does."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, [], [], False, skip_special_tokens)
    parser = tool_call_parser(TOOL_CALL_FORMATS[name](SCHEMAS))
    content, calls = "", []
    for i, token in enumerate(ids):
        detokenizer.append(token)
        piece, new = parser.feed(detokenizer.release(final=i == len(ids) - 1))
        content, calls = content + piece, calls + new
    piece, new = parser.finish()
    return content + piece, calls + new


@pytest.mark.parametrize("name, content, text", EXAMPLES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(EXAMPLES)])
def test_calls_tagged_by_special_tokens_read_back_token_by_token(tokenizer, name, content, text):
    assert TOOL_CALL_FORMATS[name].special_tokens  # the chat route turns skip_special_tokens off for it
    ids = tokenizer.encode(content + text, add_special_tokens=False)
    assert set(ids) & set(tokenizer.all_special_ids)  # its tags are special tokens here, one id each
    read, calls = stream(tokenizer, name, content + text, skip_special_tokens=False)
    assert read == content and [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    if name not in TAG_OPTIONAL:
        _, skipped = stream(tokenizer, name, content + text, skip_special_tokens=True)
        assert [(c.name, json.loads(c.arguments)) for c in skipped] != CALLS


def test_every_format_is_streamed():
    assert {name for name, _, _ in EXAMPLES} == set(TOOL_CALL_FORMATS) - set(ALIASES)
