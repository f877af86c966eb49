"""The model's tokenizer, its stop tokens and chat template, all from transformers."""

from pathlib import Path

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
) -> str:
    """The prompt text for a conversation, by the model's own chat template."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(chat_template_kwargs or {}),
    )


def encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool = True) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)
