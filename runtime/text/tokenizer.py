"""The model's tokenizer, its stop tokens and chat template, all from transformers."""

import json
from pathlib import Path

from tokenizers import pre_tokenizers
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-sequence ids: the tokenizer's plus those in generation_config.json (may be a list)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if (model_dir / "generation_config.json").exists():
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """The prompt text for a conversation, by the model's own chat template; `continue_final_message` leaves the
    last message open (its end-of-turn cut off), for the model to go on writing it.

    Earlier tool calls' arguments (JSON text, as OpenAI's API sends them) reach the template as mappings, as
    transformers documents and most families' templates read them (GLM's and MiniMax's iterate them, Llama's and
    Qwen 2.5's write them with tojson); a template that fails on a mapping (DeepSeek's joins them to strings)
    gets them as sent."""
    def render(conversation: list[dict]) -> str:
        return tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt and not continue_final_message,
                                             continue_final_message=continue_final_message,
                                             **(chat_template_kwargs or {}))

    with_mappings = [_with_argument_mappings(m) for m in messages]
    if all(a is b for a, b in zip(with_mappings, messages)):
        return render(messages)
    try:
        return render(with_mappings)
    except TypeError:
        return render(messages)


def _with_argument_mappings(message: dict) -> dict:
    """`message` with its tool calls' arguments that are JSON objects parsed (a copy; `message` when it has none)."""
    calls = message.get("tool_calls")
    parsed = [_parsed_arguments(c) for c in calls or []]
    if all(p is c for p, c in zip(parsed, calls or [])):
        return message
    return {**message, "tool_calls": parsed}


def _parsed_arguments(call):
    function = call.get("function") if isinstance(call, dict) else None
    text = function.get("arguments") if isinstance(function, dict) else None
    try:
        arguments = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):  # not JSON: given to the template as sent
        arguments = None
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool = True) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


class TokenCountBound:
    """A lower bound on a text's token count at the cost of one pass over its bytes, so that a text far too long
    for the context is refused without being tokenized (tokenizing megabytes takes seconds of a replica's CPU).

    When every byte has a token (byte-level BPE with all 256 byte symbols, or BPE with byte fallback), no token
    stands for more bytes of the normalized text than its own spelling has in UTF-8, so a text of B bytes has at
    least B / (longest spelling) tokens. A tokenizer that can drop or merge unknown characters gets no bound."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        vocab = tokenizer.get_vocab()
        self.normalizer = backend.normalizer if backend is not None else None
        self.bytes_per_token = max(len(token.encode()) for token in vocab) if _every_byte_has_a_token(backend, vocab) \
            else None

    def fewest_tokens(self, text: str) -> int:
        if self.bytes_per_token is None:
            return 0
        normalized = self.normalizer.normalize_str(text) if self.normalizer is not None else text
        return len(normalized.encode()) // self.bytes_per_token


def _every_byte_has_a_token(backend, vocab: dict[str, int]) -> bool:
    if backend is None:
        return False
    if getattr(backend.model, "byte_fallback", False):
        return True
    byte_level = backend.pre_tokenizer is not None and b'"type":"ByteLevel"' in backend.pre_tokenizer.__getstate__()
    return byte_level and all(symbol in vocab for symbol in pre_tokenizers.ByteLevel.alphabet())
