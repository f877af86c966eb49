"""The seed documents' request patterns, against the served app, with the exact response shapes."""

import json
import subprocess

import pytest
import requests

from tests.conftest import MODEL_ID


@pytest.fixture(scope="module")
def tokenizer(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model_dir)


@pytest.fixture(scope="module")
def eos_id(tokenizer):
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="module")
def stop_outcomes(tokenizer, eos_id):
    """(finish_reason, matched_stop) of a sampled reply that ended on one of the model's stop tokens."""
    return {("stop", eos_id), ("stop", tokenizer.convert_tokens_to_ids("<|endoftext|>"))}


def test_chat_completion_cell(client, eos_id):
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "List 3 countries and their capitals."}],
        temperature=0,
        max_tokens=64,
    )
    assert response.object == "chat.completion" and response.model == MODEL_ID
    choice = response.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and choice.matched_stop is None
    assert choice.message.reasoning_content is None and choice.message.tool_calls is None
    assert response.usage.completion_tokens == 64
    assert response.usage.total_tokens == response.usage.prompt_tokens + 64
    # stopping on the end-of-turn token reports its id, as SGLang does
    stopped = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=64,
        logit_bias={str(eos_id): 100},
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].matched_stop == eos_id
    assert stopped.choices[0].message.content == "" and stopped.usage.completion_tokens == 1


def test_detailed_chat_cell_is_reproducible_with_seed(client, stop_outcomes):
    kwargs = dict(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "You are a knowledgeable historian who provides concise responses."},
            {"role": "user", "content": "Tell me about ancient Rome"},
            {"role": "assistant", "content": "Ancient Rome was a civilization centered in Italy."},
            {"role": "user", "content": "What were their major achievements?"},
        ],
        temperature=0.3, max_tokens=128, top_p=0.95, presence_penalty=0.2, frequency_penalty=0.2, n=1, seed=42,
    )
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    assert first.choices[0].message.content == second.choices[0].message.content
    choice = first.choices[0]
    assert len(first.choices) == 1
    outcome = (choice.finish_reason, choice.matched_stop)
    assert (outcome == ("length", None) and first.usage.completion_tokens == 128) or outcome in stop_outcomes
    # the repeated conversation is served from the prefix cache: all its full blocks
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens // 16 * 16


def test_chat_streaming_cell(client):
    kwargs = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Say this is a test"}], max_tokens=40,
                  temperature=0)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0] is chunks[-1]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == client.chat.completions.create(**kwargs).choices[0].message.content
    assert len({c.id for c in chunks}) == 1


def test_chat_streaming_cell_as_written(client):
    """The cell itself: no max_tokens (the rest of the context) and no temperature; it reads `choices[0]` of every
    chunk."""
    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say this is a test"}], stream=True))
    assert all(len(c.choices) == 1 for c in chunks)
    assert [c for c in chunks if c.choices[0].finish_reason] == [chunks[-1]]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    if chunks[-1].choices[0].finish_reason == "length":  # the rest of the context, hundreds of tokens
        assert "".join(c.choices[0].delta.content or "" for c in chunks)


def test_stream_usage_chunk(client):
    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=7, stream=True,
        stream_options={"include_usage": True}, n=2, temperature=1.0, seed=3,
    ))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 14
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1]
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_cells(client, stop_outcomes):
    response = client.completions.create(
        model=MODEL_ID, prompt="List 3 countries and their capitals.", temperature=0, max_tokens=64, n=1, stop=None,
    )
    assert response.object == "text_completion"
    choice = response.choices[0]
    assert choice.finish_reason == "length" and choice.matched_stop is None and choice.logprobs is None
    assert response.usage.completion_tokens == 64
    detailed = client.completions.create(
        model=MODEL_ID, prompt="Write a short story about a space explorer.", temperature=0.7, max_tokens=150,
        top_p=0.9, stop=["\n\n", "THE END"], presence_penalty=0.3, frequency_penalty=0.3, n=1, seed=123,
    )
    c = detailed.choices[0]
    assert "\n\n" not in c.text and "THE END" not in c.text
    allowed = {("length", None), ("stop", "\n\n"), ("stop", "THE END")} | stop_outcomes
    assert (c.finish_reason, c.matched_stop) in allowed


def test_stop_string_is_reported_as_matched_stop(client):
    greedy = client.completions.create(model=MODEL_ID, prompt="Numbers: 0 1 2", temperature=0, max_tokens=40)
    text = greedy.choices[0].text
    stop = text[10:12]
    stopped = client.completions.create(model=MODEL_ID, prompt="Numbers: 0 1 2", temperature=0, max_tokens=40,
                                        stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].matched_stop == stop
    assert stopped.choices[0].text == text[: text.find(stop)]


def test_curl_and_requests_cells(server):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    curl = (f"curl -s {server.base_url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{json.dumps(body)}'")
    for response in (json.loads(subprocess.check_output(curl, shell=True)),
                     requests.post(f"{server.base_url}/v1/chat/completions", json=body).json()):
        # OpenAI's keys, and vLLM's prompt_logprobs (null unless asked), which vLLM's clients read
        assert set(response) == {"id", "object", "created", "model", "choices", "usage", "prompt_logprobs"}
        assert response["prompt_logprobs"] is None
        choice = response["choices"][0]
        assert set(choice) == {"index", "message", "logprobs", "finish_reason", "matched_stop"}
        # tool_calls absent when there are none, refusal null, as OpenAI sends them
        assert set(choice["message"]) == {"role", "content", "refusal", "reasoning_content"}
        assert set(response["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens",
                                          "prompt_tokens_details", "completion_tokens_details"}
        assert response["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_native_generate_cells(server):
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
    response = requests.post(f"{server.base_url}/generate", json=body).json()
    assert set(response) == {"text", "output_ids", "meta_info"}
    meta = response["meta_info"]
    assert set(meta) == {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"}
    assert meta["finish_reason"] == {"type": "length", "length": 32}
    assert len(response["output_ids"]) == 32 == meta["completion_tokens"]

    streamed = requests.post(f"{server.base_url}/generate", json={**body, "stream": True}, stream=True)
    prev, texts, done = 0, [], False
    for chunk in streamed.iter_lines(decode_unicode=False):
        chunk = chunk.decode("utf-8")
        if chunk and chunk.startswith("data:"):
            if chunk == "data: [DONE]":
                done = True
                break
            data = json.loads(chunk[5:].strip("\n"))
            output = data["text"]
            assert output.startswith(texts[-1] if texts else "")  # cumulative
            texts.append(output)
            prev = len(output)
    assert done and texts[-1] == response["text"] and prev == len(response["text"])

    by_ids = requests.post(f"{server.base_url}/generate", json={
        "input_ids": [response["output_ids"][:5]], "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    assert isinstance(by_ids, list) and len(by_ids[0]["output_ids"]) == 3


def test_models_and_health(server):
    models = requests.get(f"{server.base_url}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL_ID]
    card = requests.get(f"{server.base_url}/v1/models/{MODEL_ID}").json()
    assert card["id"] == MODEL_ID and card["object"] == "model"
    assert card["max_model_len"] == models["data"][0]["max_model_len"] == 512  # the test app's engine_kwargs
    missing = requests.get(f"{server.base_url}/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert requests.get(f"{server.base_url}/health").json() == {"status": "ok"}
