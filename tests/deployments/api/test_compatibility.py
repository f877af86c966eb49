"""What other servers' clients send is accepted, and what they read is there: unknown fields ignored (and named
in a header), echoed assistant messages, custom roles, newer OpenAI fields, vLLM's structured-output names,
`reasoning_content: null` on every stream delta; `stream_options` without `stream` is a 400, as peers answer."""

import json
import re

import pytest
import requests

from tests.conftest import MODEL_ID

HI = [{"role": "user", "content": "hi"}]


def test_unknown_fields_are_ignored_and_named_in_a_header(server):
    r = requests.post(f"{server.base_url}/v1/completions",
                      json={"prompt": "hi", "max_tokens": 2, "temperatur": 0.5, "best_effort": {"x": 1}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert r.headers["x-ignored-fields"] == "best_effort,temperatur"
    # found by the fuzz suite: a header is Latin-1 and one line, so names are escaped as in JSON
    odd = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 1, "é\n🙂": 1})
    assert odd.status_code == 200 and odd.headers["x-ignored-fields"] == "\\u00e9\\n\\ud83d\\ude42"
    assert "x-ignored-fields" not in requests.post(f"{server.base_url}/v1/completions",
                                                   json={"prompt": "hi", "max_tokens": 1}).headers


def test_a_multi_turn_conversation_echoes_the_sdks_message_back(client):
    messages = list(HI)
    for turn in range(2):
        reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4)
        messages.append(reply.choices[0].message.model_dump())  # refusal, annotations, audio, function_call, ...
        messages.append({"role": "user", "content": f"and turn {turn}?"})
    assert set(messages[1]) >= {"refusal", "annotations", "audio", "function_call", "reasoning_content"}


def test_newer_openai_fields_and_custom_roles_are_accepted(client):
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "narrator", "content": "Once"}, *HI], max_tokens=3,
        extra_body={"reasoning_effort": "low", "prompt_cache_key": "k", "safety_identifier": "s", "verbosity": "low",
                    "modalities": ["text"], "prediction": None, "audio": None,
                    "functions": [{"name": "f", "parameters": {"type": "object"}}]})
    assert reply.usage.completion_tokens >= 1


def test_stream_options_without_stream_is_400(server):
    r = requests.post(f"{server.base_url}/v1/chat/completions",
                      json={"messages": HI, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] is None or "stream_options" in r.text


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
    ({"structured_outputs": {"choice": ["left", "right \"quoted\""]}}, lambda t: t in ("left", 'right "quoted"')),
    ({"guided_regex": "[0-9]{3}"}, lambda text: re.fullmatch("[0-9]{3}", text)),
    ({"structured_outputs": {"regex": "(ab)+"}}, lambda text: re.fullmatch("(ab)+", text)),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     lambda text: isinstance(json.loads(text)["n"], int)),
    ({"structured_outputs": {"json": {"type": "array", "items": {"type": "boolean"}, "minItems": 1}}},
     lambda text: all(isinstance(x, bool) for x in json.loads(text)) and json.loads(text)),
    ({"guided_grammar": 'root ::= "A" | "B"'}, lambda text: text in ("A", "B")),
])
def test_vllms_structured_output_names_constrain_the_output(client, extra, check):
    reply = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=40, temperature=1.0, seed=3,
                                           extra_body=extra)
    assert check(reply.choices[0].message.content), reply.choices[0].message.content


def test_two_constraints_at_once_are_400(server):
    r = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "regex": "a", "guided_choice": ["b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_choice"


def test_every_stream_delta_has_reasoning_content(client):
    stream = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=5, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert len(deltas) >= 3 and all(d.reasoning_content is None for d in deltas)  # an AttributeError if absent


def _completion_stream(server, **body) -> list[dict]:
    with requests.post(f"{server.base_url}/v1/completions", stream=True,
                       json={"prompt": "The capital of France", "max_tokens": 6, "temperature": 0, "stream": True,
                             "ignore_eos": True, **body}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]


def test_completion_top_logprobs_hold_the_sampled_token(server):
    """OpenAI's legacy completions: up to logprobs + 1 entries, the sampled token's among them."""
    for k in (0, 2):
        r = requests.post(f"{server.base_url}/v1/completions",
                          json={"prompt": "hi", "max_tokens": 5, "temperature": 2.0, "seed": 1, "logprobs": k})
        logprobs = r.json()["choices"][0]["logprobs"]
        for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
            assert top[token] == logprob and len(top) <= k + 1 and (k > 0 or len(top) == 1)


def test_completion_stream_chunks_carry_logprobs_and_the_last_token_carries_finish_reason(server):
    chunks = _completion_stream(server, logprobs=1)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert all(c["logprobs"] is not None for c in choices)
    assert [c["finish_reason"] for c in choices].count("length") == 1 and choices[-1]["finish_reason"] == "length"
    assert choices[-1]["logprobs"]["tokens"]  # the finish rides on the chunk with the last token
    assert sum(len(c["logprobs"]["tokens"]) for c in choices) == 6


def test_an_echoed_prompt_streams_with_the_logprobs_the_reply_has(server):
    body = {"prompt": "The capital of France", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    whole = requests.post(f"{server.base_url}/v1/completions", json=body).json()["choices"][0]["logprobs"]
    first = _completion_stream(server, echo=True, logprobs=1, max_tokens=3)[0]["choices"][0]
    prompt_tokens = len(first["logprobs"]["tokens"])
    assert first["logprobs"]["token_logprobs"][0] is None and prompt_tokens > 1
    assert first["logprobs"]["token_logprobs"] == whole["token_logprobs"][:prompt_tokens]
    assert first["logprobs"]["text_offset"] == whole["text_offset"][:prompt_tokens]


def test_return_token_ids_gives_the_prompt_and_output_ids_streamed_or_not(server, client):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
    body = dict(model=MODEL_ID, messages=HI, max_tokens=6, temperature=0, extra_body={"return_token_ids": True})
    reply = client.chat.completions.create(**body).model_dump()
    rendered = tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert reply["prompt_token_ids"] == list(prompt)
    token_ids = reply["choices"][0]["token_ids"]
    assert len(token_ids) == 6 and tokenizer.decode(token_ids) == reply["choices"][0]["message"]["content"]
    chunks = [c.model_dump() for c in client.chat.completions.create(stream=True, **body)]
    assert chunks[0]["prompt_token_ids"] == list(prompt)
    assert [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []] == token_ids

    text = requests.post(f"{server.base_url}/v1/completions", json={
        "prompt": "hello", "max_tokens": 4, "temperature": 0, "return_token_ids": True}).json()["choices"][0]
    assert text["prompt_token_ids"] == tokenizer("hello")["input_ids"] and len(text["token_ids"]) == 4
    chunks = _completion_stream(server, prompt="hello", max_tokens=4, return_token_ids=True)
    streamed = [c["choices"][0] for c in chunks]
    assert streamed[0]["prompt_token_ids"] == text["prompt_token_ids"]
    assert [t for c in streamed for t in c["token_ids"]] == text["token_ids"]


def test_prompt_logprobs_are_vllms_shape_with_transformers_values(server):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(server.model_dir)("The capital of France")["input_ids"]
    reply = requests.post(f"{server.base_url}/v1/completions", json={
        "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2}).json()
    entries = reply["choices"][0]["prompt_logprobs"]
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
    assert entries[0] is None and len(entries) == len(ids)
    for i in range(1, len(ids)):
        entry = entries[i][str(ids[i])]
        assert entry["logprob"] == pytest.approx(ref[i - 1, ids[i]].item(), abs=1e-4)
        assert entry["rank"] == 1 + int((ref[i - 1] > ref[i - 1, ids[i]]).sum())
        top = torch.topk(ref[i - 1], 2).indices.tolist()
        assert set(entries[i]) == {str(ids[i]), *map(str, top)}
    chat = requests.post(f"{server.base_url}/v1/chat/completions", json={
        "messages": HI, "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
    streamed = requests.post(f"{server.base_url}/v1/chat/completions", json={
        "messages": HI, "stream": True, "prompt_logprobs": 1})
    assert streamed.status_code == 400


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client):
    def chunks(options):
        return list(client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=5, stream=True,
                                                   stream_options=options))

    every = chunks({"include_usage": True, "continuous_usage_stats": True})
    assert all(c.usage is not None for c in every)
    counts = [c.usage.completion_tokens for c in every]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 5
    assert all(c.usage.prompt_tokens == every[0].usage.prompt_tokens for c in every)
    last_only = chunks({"include_usage": True})
    assert [c.usage is not None for c in last_only] == [False] * (len(last_only) - 1) + [True]


def test_sglangs_stop_regex_ends_the_output_at_its_first_match(server, client):
    text = "abc123def456"
    reply = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=30, extra_body={
        **{"ebnf": "root ::= " + json.dumps(text), "temperature": 0}, "stop_regex": ["[0-9]{2}", "x+y"]})
    choice = reply.choices[0]
    content = choice.message.content
    assert choice.finish_reason == "stop" and choice.model_extra["matched_stop"] == "[0-9]{2}"
    assert text.startswith(content) and re.search("[0-9]{2}", content) and len(content) < len("abc123def")
    generated = requests.post(f"{server.base_url}/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 30, "temperature": 0, "ebnf": "root ::= " + json.dumps(text), "stop_regex": "d.f"}}).json()
    assert text.startswith(generated["text"]) and "def" in generated["text"] and "456" not in generated["text"]
    assert generated["meta_info"]["finish_reason"]["matched"] == "d.f"
    for bad in ("(", ["a"] * 5, "a" * 2000):
        r = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "stop_regex": bad})
        assert r.status_code == 400 and "stop_regex" in r.json()["error"]["param"], r.text
    # a pattern that backtracks exponentially in Python's re runs in linear time in RE2
    slow = requests.post(f"{server.base_url}/v1/completions", json={
        "prompt": "hi", "max_tokens": 64, "ignore_eos": True, "stop_regex": "(a+)+$"})
    assert slow.status_code == 200
