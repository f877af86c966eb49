"""Incremental detokenization: stop strings across token boundaries, holdback, whole characters."""

import asyncio
import random
import time

import pytest

from runtime import LLM, AsyncLLMEngine, InvalidInputError, SamplingParams
from runtime.outputs import request_deltas
from runtime.sampling_params import MAX_STOP_CHARS
from runtime.text.detokenizer import IncrementalDetokenizer


def _stream(tokenizer, token_ids, stop=(), include_stop=False):
    detok = IncrementalDetokenizer(tokenizer, [], list(stop), include_stop, skip_special_tokens=True)
    pieces, matched = [], None
    for t in token_ids:
        matched = detok.append(t)
        pieces.append(detok.release(final=matched is not None))
        if matched:
            break
    if matched is None:
        pieces.append(detok.release(final=True))
    return pieces, matched


def test_multibyte_characters_are_never_split(qwen2_model):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=128)
    text = "Grüße 世界 🙂🚀 déjà vu"
    ids = llm.tokenizer.encode(text)
    assert len(ids) > len(text.split())  # the tokenizer splits characters into byte tokens
    pieces, _ = _stream(llm.tokenizer, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens were held until their character completed


def test_bytes_that_never_form_a_character_are_released_at_the_end_as_the_tokenizer_decodes_them(qwen2_model):
    """A model may emit byte tokens that no later token completes (a random model repeating one): they wait while
    a character may still form, and the last release carries them as replacement characters, as a decode of
    the whole output does, rather than dropping them."""
    tokenizer = LLM(str(qwen2_model), dtype="float32", max_model_len=128).tokenizer
    lead_byte = tokenizer.convert_tokens_to_ids("\u00e2")  # byte-level BPE's token for the lone byte 0xE2
    for ids in ([lead_byte] * 5, tokenizer.encode("Hi") + [lead_byte] * 3, [lead_byte] + tokenizer.encode("€ end")):
        pieces, _ = _stream(tokenizer, ids)
        assert "".join(pieces) == tokenizer.decode(ids)
        assert all(not p.endswith("\ufffd") for p in pieces[:-1])  # mid-stream, only bytes a character followed


def test_text_decoded_when_released_is_the_text_decoded_token_by_token(qwen2_model):
    """Without a stop to look for, tokens are decoded only when text is released, all those since the last release
    at once: released after every token, now and then, or only at the end, the text is the same as a detokenizer
    that decodes every token as it comes (one looking for a stop that never occurs). Random ids include byte
    tokens, so windows end mid-character; and a real sentence with multi-byte characters."""
    tokenizer = LLM(str(qwen2_model), dtype="float32", max_model_len=128).tokenizer
    rng = random.Random(7)
    sequences = [[rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 60))] for _ in range(200)]
    sequences.append(tokenizer.encode("Grüße 世界 🙂🚀 déjà vu, and the end"))
    for ids in sequences:
        prompt = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(0, 8))]
        eager = IncrementalDetokenizer(tokenizer, prompt, ["\x00never"], False, skip_special_tokens=True)
        for t in ids:
            eager.append(t)
        expected = eager.release(final=True)
        for release_every in (1, rng.randrange(2, 9), len(ids)):
            lazy = IncrementalDetokenizer(tokenizer, prompt, [], False, skip_special_tokens=True)
            pieces = []
            for i, t in enumerate(ids, 1):
                assert lazy.append(t) is None
                if i % release_every == 0 and i < len(ids):
                    pieces.append(lazy.release(final=False))
            pieces.append(lazy.release(final=True))
            assert "".join(pieces) == expected == lazy.text
            assert all(not p.endswith("\ufffd") for p in pieces[:-1])  # no piece ends mid-character


def test_a_request_read_only_whole_carries_its_text_in_its_last_delta(qwen2_model):
    """`stream` False: the deltas before the last carry the tokens and no text; the last carries it all, the
    same text the streamed request builds piece by piece."""
    from runtime.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = engine.tokenizer.encode("Grüße 世界")
    engine.add_request("streamed", prompt, params)
    engine.add_request("whole", prompt, params, stream=False)
    deltas: dict[str, list] = {"streamed": [], "whole": []}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            deltas[delta.request_id].append(delta.seqs[0])
    streamed, whole = deltas["streamed"], deltas["whole"]
    assert [d.token_ids for d in whole] == [d.token_ids for d in streamed] and len(whole) == 12
    assert all(d.text == "" for d in whole[:-1]) and whole[-1].finish_reason == "length"
    assert whole[-1].text == "".join(d.text for d in streamed) != ""


def test_streamed_text_holds_back_a_possible_stop_string(qwen2_model):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=128)
    ids = llm.tokenizer.encode("Hello world, the end")
    pieces, matched = _stream(llm.tokenizer, ids, stop=["world, th"])
    assert matched == "world, th"
    assert "".join(pieces) == "Hello "
    assert not any("w" in p for p in pieces)  # "w", "wor"... were never released
    pieces, matched = _stream(llm.tokenizer, ids, stop=["world, th"], include_stop=True)
    assert "".join(pieces) == "Hello world, th"
    pieces, matched = _stream(llm.tokenizer, ids, stop=["worm"])  # a false start is released
    assert matched is None and "".join(pieces) == "Hello world, the end"


def test_stop_string_across_token_boundary_in_generation(qwen2_model):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    prompt = llm.tokenizer.encode("Numbers: 0 1 2")
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llm.generate([prompt], greedy)[0].outputs[0]
    pieces = [llm.tokenizer.decode([t]) for t in full.token_ids]
    k = next(i for i in range(5, len(pieces) - 1)
             if pieces[i].isprintable() and pieces[i + 1].isprintable() and pieces[i] and pieces[i + 1])
    stop = pieces[k][-1] + pieces[k + 1][0]  # straddles tokens k and k + 1
    cut = full.text.find(stop)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[0]
    choice = out.outputs[0]
    assert choice.finish_reason == "stop" and choice.matched_stop == stop
    assert choice.text == full.text[:cut]
    assert choice.token_ids == full.token_ids[: len(choice.token_ids)]
    assert stop not in choice.text


def _stop_ending_at_a_token(tokenizer, token_ids: list[int]) -> tuple[str, int]:
    """A stop string whose first match in the text of `token_ids` ends with the text of a token: (the stop, how
    many tokens up to that one)."""
    text = tokenizer.decode(token_ids)
    for k in range(6, len(token_ids)):
        head = tokenizer.decode(token_ids[:k])
        stop = head[-2:]
        if len(stop) == 2 and stop.isprintable() and text.find(stop) + 2 == len(head) and head == text[:len(head)]:
            return stop, k
    raise AssertionError("no token ends a first match")


def test_a_stop_string_retires_its_sequence_within_a_step_and_no_token_after_it_reaches_the_caller(qwen2_model):
    """The text stage finds the stop after the step: the engine retires the sequence at its next step. Stepped
    with its text (the offline engine), it computes no token past the stop; with the text on a thread of its own
    (AsyncLLMEngine), at most one, which the caller never sees."""
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    prompt = llm.tokenizer.encode("Numbers: 0 1 2")
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llm.generate([prompt], greedy)[0].outputs[0]
    stop, k = _stop_ending_at_a_token(llm.tokenizer, full.token_ids)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])

    def counting(engine) -> list[int]:
        computed, step_tokens = [], engine.step_tokens

        def step():
            step = step_tokens()
            computed.extend(t for d in request_deltas(step) for s in d.seqs for t in s.token_ids)
            return step
        engine.step_tokens = step
        return computed

    computed = counting(llm.engine)
    out = llm.generate([prompt], params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:k] and computed == full.token_ids[:k]

    async def stream(engine):
        return [delta async for delta in engine.generate(engine.validate(prompt, params))]

    engine = AsyncLLMEngine.from_options(str(qwen2_model), dtype="float32", max_model_len=256)
    try:
        computed = counting(engine.engine)
        deltas = asyncio.run(stream(engine))
        deadline = time.monotonic() + 10
        while engine.stats()["num_requests"]:  # the engine retires it a step after the caller's stream ended
            assert time.monotonic() < deadline, "the engine never retired the stopped sequence"
            time.sleep(0.01)
    finally:
        engine.shutdown()
    assert [t for d in deltas for t in d.seqs[0].token_ids] == full.token_ids[:k]
    assert deltas[-1].seqs[0].finish_reason == "stop" and deltas[-1].seqs[0].num_output_tokens == k
    assert "".join(d.seqs[0].text for d in deltas) == full.text[:full.text.find(stop)]
    assert computed[:k] == full.token_ids[:k] and len(computed) <= k + 1


def test_a_stop_regex_stops_at_the_first_token_whose_text_completes_a_match(qwen2_model):
    """The tail searched for a bounded pattern finds every match the whole text has, at the same token;
    `\\b` and `^` still see the text before the tail."""
    import re2

    from runtime.text.detokenizer import longest_match

    tokenizer = LLM(str(qwen2_model), dtype="float32", max_model_len=128).tokenizer
    patterns = [r"end\d{2}", r"\bab", "^x", r"a\B", "b[ac]{2,5}d", "(ab)+c", "é{3}"]
    assert [longest_match(p) for p in patterns] == [8, 4, 2, 3, 11, None, 4]
    assert longest_match("a{1,20}") == 20 and longest_match(r"\pL") is None
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(["a", "b", "c", "d", " ", "end", "4", "x", "é"]) for _ in range(60))
        ids = tokenizer.encode(text)
        for pattern in patterns:
            detok = IncrementalDetokenizer(tokenizer, [], [], False, skip_special_tokens=True, stop_regex=[pattern])
            stopped_at = next((i for i, t in enumerate(ids) if detok.append(t)), None)
            whole = [re2.search(pattern, tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
            assert stopped_at == next((i for i, m in enumerate(whole) if m), None), (pattern, text)


# --- stop strings in linear time: the same outputs as the direct search, checked against it ------------------

class _Pieces:
    """A tokenizer whose token i decodes to `vocab[i]`: any text split any way, no model needed."""

    def __init__(self):
        self.vocab: list[str] = []

    def ids(self, pieces: list[str]) -> list[int]:
        self.vocab += pieces
        return list(range(len(self.vocab) - len(pieces), len(self.vocab)))

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.vocab[i] for i in ids)


def _direct(pieces: list[str], stop: list[str], include_stop: bool, checks: list[bool]):
    """The reference: search the text after each token for a match that ends in its new text; hold back the
    longest proper prefix of any stop that the text ends with. Per token: (matched stop, released text)."""
    text, emitted, out = "", 0, []
    for new, check in zip(pieces, checks):
        checked, matched = len(text), None
        text += new
        if new and check:
            found = [(text.find(s, max(0, checked - len(s) + 1)), i, s) for i, s in enumerate(stop)]
            found = [f for f in found if f[0] != -1]
            if found:
                pos, _, matched = min(found)
                text = text[: pos + len(matched) if include_stop else pos]
        held = max((k for s in stop for k in range(min(len(s) - 1, len(text)) + 1) if text.endswith(s[:k])),
                   default=0)
        end = len(text) if matched else len(text) - held
        out.append((matched, text[emitted:end] if end > emitted else ""))
        emitted = max(emitted, end)
        if matched:
            break
    return out, text


def _linear(pieces: list[str], stop: list[str], include_stop: bool, checks: list[bool]):
    tokenizer = _Pieces()
    detok = IncrementalDetokenizer(tokenizer, [], stop, include_stop, skip_special_tokens=True)
    out = []
    for token_id, check in zip(tokenizer.ids(pieces), checks):
        matched = detok.append(token_id, check_stop=check)
        out.append((matched, detok.release(final=matched is not None)))
        if matched:
            break
    return out, detok.text


def test_stop_strings_match_and_hold_back_exactly_as_a_direct_search():
    rng = random.Random(0)
    for case in range(3000):
        alphabet = rng.choice(["ab", "abc", "aab", "abé"])
        stop = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(1, 4))]
        pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 30))]
        unchecked = rng.choice([0, 0, rng.randint(0, len(pieces))])  # min_tokens: early tokens are not checked
        checks = [i >= unchecked for i in range(len(pieces))]
        include_stop = rng.random() < 0.3
        assert _linear(pieces, stop, include_stop, checks) == _direct(pieces, stop, include_stop, checks), case


def test_many_long_stop_strings_cost_linear_time():
    """64 stops of 16,000 characters over 2,000 tokens of 8: the text always ends in a long prefix of every
    stop (the worst case for the old per-token hold-back, quadratic in it)."""
    stop = ["a" * 15999 + chr(0x100 + i) for i in range(64)]
    pieces = ["a" * 8] * 2000
    start = time.perf_counter()
    out, text = _linear(pieces, stop, False, [True] * len(pieces))
    elapsed = time.perf_counter() - start
    assert all(matched is None and released == "" for matched, released in out[:-1])  # all of it held back
    assert out[-1] == (None, "a")  # 16,000 characters: only the first can no longer start a stop
    assert text == "a" * 16000
    assert elapsed < 30, elapsed  # a bound a quadratic check cannot meet at these sizes


def test_a_stop_string_over_the_cap_is_refused_naming_stop():
    assert SamplingParams(stop=["x" * MAX_STOP_CHARS]).stop == ["x" * MAX_STOP_CHARS]
    with pytest.raises(InvalidInputError) as e:
        SamplingParams(stop=["ok", "x" * (MAX_STOP_CHARS + 1)])
    assert e.value.param == "stop" and "at most 1,024 characters; one has 1,025" in str(e.value)
