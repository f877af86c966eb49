"""Pieces of OpenAI response bodies shared by the routes: timestamps, stream chunks, usage, logprobs
(list pages: pagination.py)."""

import time

from runtime import TokenLogprob


def now() -> int:
    return int(time.time())


def chunk_builder(request_id: str, object_type: str, model: str):
    """`chunk(choices, **extra)`: one chunk of a streamed reply; every chunk carries the same id, object,
    creation time and model."""
    head = {"id": request_id, "object": object_type, "created": now(), "model": model}

    def chunk(choices: list[dict], **extra) -> dict:
        return {**head, "choices": choices, **extra}

    return chunk


class TokenTexts:
    """Token id -> its text and that text's UTF-8 bytes, memoised per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> str:
        return self._entry(token_id)[0]

    def utf8(self, token_id: int) -> list[int]:
        return self._entry(token_id)[1]

    def _entry(self, token_id: int) -> tuple[str, list[int]]:
        entry = self._cache.get(token_id)
        if entry is None:
            text = self.tokenizer.decode([token_id])
            entry = self._cache[token_id] = (text, list(text.encode("utf-8")))
        return entry


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int | None = None) -> dict:
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def chat_logprobs(entries: list[TokenLogprob], texts: TokenTexts) -> dict:
    """`choices[i].logprobs` of a chat completion."""

    def item(token_id: int, logprob: float) -> dict:
        return {"token": texts(token_id), "logprob": logprob, "bytes": texts.utf8(token_id)}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
        ],
        "refusal": None,  # OpenAI's schema requires the key
    }


def completion_logprobs(entries: list[TokenLogprob | None], token_ids: list[int], texts: TokenTexts,
                        offset: int = 0) -> dict:
    """`choices[i].logprobs` of a legacy completion; `None` entries are prompt tokens without a logprob."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, e in zip(token_ids, entries):
        text = texts(token_id)
        tokens.append(text)
        token_logprobs.append(None if e is None else e.logprob)
        # up to logprobs + 1 entries, the sampled token's among them (as OpenAI's legacy completions)
        tops.append(None if e is None else {**{texts(t): lp for t, lp in e.top}, text: e.logprob})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_json(entries: list[TokenLogprob | None], texts: TokenTexts) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: per prompt token (the first has none), by token id, its logprob, rank and text,
    and the same for the top alternatives."""

    def item(logprob: float, rank: int, token_id: int) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": texts(token_id)}

    out: list[dict | None] = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        entry = {str(t): item(lp, rank, t) for rank, (t, lp) in enumerate(e.top, 1)}
        entry[str(e.token_id)] = item(e.logprob, e.rank, e.token_id)
        out.append(entry)
    return out
