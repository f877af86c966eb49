"""Incremental detokenization: stop strings across token boundaries, holdback, whole characters."""

from runtime import LLM, SamplingParams
from runtime.detokenizer import IncrementalDetokenizer


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


def test_a_stop_regex_stops_at_the_first_token_whose_text_completes_a_match(qwen2_model):
    """The tail searched for a bounded pattern finds every match the whole text has, at the same token;
    `\\b` and `^` still see the text before the tail."""
    import random

    import re2

    from runtime.detokenizer import longest_match

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
