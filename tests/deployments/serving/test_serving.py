"""The served app against the offline engine, under concurrency, disconnects and bad input."""

import asyncio
import json

import openai
import pytest
import requests

from runtime import LLM, SamplingParams
from testing.helpers import wait_until
from tests.conftest import MODEL_ID


@pytest.fixture(scope="module")
def offline(server):
    return LLM(str(server.model_dir), **server.engine_kwargs)


def test_greedy_http_equals_offline_engine(server, offline):
    client = openai.Client(base_url=server.openai_url, api_key="None")
    messages = [{"role": "user", "content": "List 3 countries and their capitals."}]
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=30)
    expected = offline.chat(messages, SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert chat.choices[0].message.content == expected.text
    assert chat.usage.completion_tokens == len(expected.token_ids)

    prompts = ["The capital of France is", "def add(a, b):"]
    completion = client.completions.create(model=MODEL_ID, prompt=prompts, temperature=0, max_tokens=20, n=2)
    expected = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=20, n=2))
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert [c.text for c in completion.choices] == [c.text for o in expected for c in o.outputs]

    token_prompt = offline.tokenizer.encode("Numbers: 0 1 2")
    by_ids = client.completions.create(model=MODEL_ID, prompt=token_prompt, temperature=0, max_tokens=12)
    assert by_ids.choices[0].text == offline.generate([token_prompt], SamplingParams(
        temperature=0, max_tokens=12))[0].outputs[0].text

    streamed = client.completions.create(model=MODEL_ID, prompt=prompts[0], temperature=0, max_tokens=20,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected[0].outputs[0].text


def test_echo_and_integer_logprobs(server, offline):
    client = openai.Client(base_url=server.openai_url, api_key="None")
    prompt = "Question: what is 2 + 2?"
    out = client.completions.create(model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=5, logprobs=2,
                                    echo=True)
    choice = out.choices[0]
    n_prompt = out.usage.prompt_tokens
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + 5 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(t) <= 3 and token in t for token, t in zip(lp.tokens[1:], lp.top_logprobs[1:]))  # k + sampled
    assert lp.text_offset[0] == 0
    assert "".join(lp.tokens) == choice.text
    ref = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=5, logprobs=2, prompt_logprobs=2))[0]
    assert lp.token_logprobs[n_prompt:] == pytest.approx([e.logprob for e in ref.outputs[0].logprobs], abs=1e-4)
    assert lp.token_logprobs[1:n_prompt] == pytest.approx([e.logprob for e in ref.prompt_logprobs[1:]], abs=1e-4)


def test_max_tokens_zero_with_echo_scores_the_prompt(server, offline):
    """OpenAI's spec allows max_tokens 0 on completions: with echo and logprobs it is how a prompt is scored
    (lm-eval's loglikelihood); streamed or not, the prompt comes back with its logprobs and nothing is generated.
    SGLang's /generate takes max_new_tokens 0 too."""
    client = openai.Client(base_url=server.openai_url, api_key="None")
    prompt = "Question: what is 2 + 2?"
    ref = offline.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    out = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, logprobs=1, echo=True)
    choice = out.choices[0]
    assert (choice.text, choice.finish_reason, out.usage.completion_tokens) == (prompt, "length", 0)
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx([e.logprob for e in ref.prompt_logprobs[1:]], abs=1e-4)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, logprobs=1, echo=True,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == prompt
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    generated = requests.post(f"{server.base_url}/generate", json={
        "text": prompt, "sampling_params": {"max_new_tokens": 0}}).json()
    assert generated["text"] == "" and generated["meta_info"]["completion_tokens"] == 0
    assert generated["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_repeated_long_prefix_reports_cached_tokens(server):
    client = openai.Client(base_url=server.openai_url, api_key="None")
    system = "You are a careful assistant. " * 20
    usages = []
    for question in ("Name a river.", "Name a mountain."):
        r = client.chat.completions.create(model=MODEL_ID, max_tokens=3, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": question}])
        usages.append(r.usage)
    assert usages[1].prompt_tokens_details.cached_tokens >= 96


def test_64_concurrent_streams_complete(server):
    client = openai.AsyncClient(base_url=server.openai_url, api_key="None")

    async def one(i):
        stream = await client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=16,
            stream=True, extra_body={"ignore_eos": True})
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return finish

    async def main():
        return await asyncio.gather(*(one(i) for i in range(64)))

    assert asyncio.run(main()) == ["length"] * 64


def assert_a_disconnect_frees_blocks(openai_url: str, engine_stats) -> None:
    """A client leaving mid-stream aborts its request: the engine ends with no request and every block free."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Tell me a long story"}], "stream": True,
            "max_tokens": 400, "ignore_eos": True}
    response = requests.post(f"{openai_url}/chat/completions", json=body, stream=True)
    lines = response.iter_lines()
    for _ in range(3):
        next(lines)
    assert engine_stats()["num_requests"] == 1
    response.close()
    wait_until(lambda: engine_stats()["num_requests"] == 0, timeout=30, every=0.05)
    stats = engine_stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_disconnected_stream_is_aborted_and_frees_its_blocks(server):
    assert_a_disconnect_frees_blocks(server.openai_url, server.engine_stats)


LONG = "word " * 600
BAD_INPUTS = [
    ("malformed JSON", "/v1/chat/completions", b"{not json", "application/json", 400),
    ("not an object", "/v1/chat/completions", b"[1, 2]", "application/json", 400),
    ("wrong content type", "/v1/chat/completions", b"model=x", "application/x-www-form-urlencoded", 400),
    ("empty messages", "/v1/chat/completions", {"messages": []}, None, 400),
    ("empty role", "/v1/chat/completions", {"messages": [{"role": "", "content": "hi"}]}, None, 400),
    ("a role that is not a string", "/v1/chat/completions", {"messages": [{"role": 7, "content": "hi"}]}, None, 400),
    ("messages not a list", "/v1/chat/completions", {"messages": "hi"}, None, 400),
    ("temperature -1", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                "temperature": -1}, None, 400),
    ("temperature a string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                      "temperature": "hot"}, None, 400),
    ("n 0", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, None, 400),
    ("max_tokens 0", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 0}, None, 400),
    ("max_tokens past the context", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, None, 400),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]},
     None, 404),
    ("too-long prompt", "/v1/completions", {"prompt": LONG}, None, 400),
    ("top_p 2", "/v1/completions", {"prompt": "hi", "top_p": 2}, None, 400),
    ("a known field of the wrong type", "/v1/completions", {"prompt": "hi", "temperature": "warm"}, None, 400),
    ("empty prompt list", "/v1/completions", {"prompt": []}, None, 400),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [1, 99999999]}, None, 400),
    ("five stop strings", "/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, None, 400),
    ("bad logit_bias key", "/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, None, 400),
    ("5,000-digit logit_bias key", "/v1/completions", {"prompt": "hi", "logit_bias": {"9" * 5000: 1}}, None, 400),
    ("logit_bias id outside the vocabulary", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "temperature": 1, "logit_bias": {"99999999": 5}}, None, 400),
    ("stop_token_ids outside the vocabulary", "/v1/completions",
     {"prompt": "hi", "temperature": 1, "min_tokens": 2, "stop_token_ids": [-5]}, None, 400),
    ("priority past int32", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "priority": 2**31}, None, 400),
    ("priority a string", "/v1/completions", {"prompt": "hi", "priority": "high"}, None, 400),
    ("seed below int64", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "temperature": 1, "seed": -9223372036854775809}, None, 400),
    ("generate without a prompt", "/generate", {"sampling_params": {"max_new_tokens": 2}}, None, 400),
    ("generate unknown sampling param", "/generate", {"text": "hi", "sampling_params": {"foo": 1}}, None, 400),
    ("huge body", "/v1/completions", b"{" + b" " * (17 * 1024 * 1024) + b"}", "application/json", 413),
    ("100,000 nested lists", "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "application/json", 400),
    ("a 5,000-digit max_tokens", "/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
     "application/json", 400),
    ("a lone surrogate", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "application/json", 400),
    ("NaN temperature", "/generate", b'{"text": "hi", "sampling_params": {"temperature": NaN}}', "application/json",
     400),
    ("UTF-16 body", "/v1/completions", '{"prompt": "hi"}'.encode("utf-16"), "application/json", 400),
    ("infinite repetition penalty", "/generate", b'{"text": "hi", "sampling_params": {"repetition_penalty": 1e999}}',
     "application/json", 400),
    ("a request-supplied chat template", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"chat_template": "{{ 'x' * 9 }}"}},
     None, 400),
    ("2,000 stop_token_ids", "/v1/completions", {"prompt": "hi", "stop_token_ids": [5] * 2000}, None, 400),
    ("100 stop strings on /generate", "/generate", {"text": "hi", "sampling_params": {"stop": ["a"] * 100}}, None,
     400),
    ("a 40,000-character regex", "/v1/completions", {"prompt": "hi", "regex": "a" * 40_000}, None, 400),
    ("a grammar that matches nothing", "/v1/completions", {"prompt": "hi", "ebnf": "root ::= root"}, None, 400),
    ("100 prompts x n 128", "/v1/completions", {"prompt": ["hi"] * 100, "n": 128, "max_tokens": 1}, None, 400),
    ("n 64 x 1,500 tokens x 21 logprobs", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "n": 64, "max_tokens": 1500, "logprobs": True,
      "top_logprobs": 20}, None, 400),
]


@pytest.mark.parametrize("name, path, body, content_type, status", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_openai_error_and_server_keeps_serving(server, name, path, body, content_type, status):
    url = f"{server.base_url}{path}"
    if isinstance(body, bytes):
        response = requests.post(url, data=body, headers={"Content-Type": content_type})
    else:
        response = requests.post(url, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if isinstance(body, dict) and "stream" not in body:
        streamed = requests.post(url, json={**body, "stream": True})
        assert streamed.status_code == status and "error" in streamed.json()
    ok = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                                        ("/v1/completions", {"prompt": "hi", "max_tokens": None})])
def test_min_tokens_past_the_context_with_no_max_tokens_is_a_400_naming_it(server, path, body):
    """With no max_tokens the completion may run to the context's end; a min_tokens past it is refused (as vLLM
    refuses one past max_tokens), not run until the context is full."""
    response = requests.post(f"{server.base_url}{path}", json={**body, "min_tokens": 10**30})
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"
    assert "the context leaves" in response.json()["error"]["message"]


def test_too_long_prompt_message_has_the_token_counts(server):
    response = requests.post(f"{server.base_url}/v1/completions", json={"prompt": LONG})
    message = response.json()["error"]["message"]
    assert "512" in message and "prompt has" in message


def test_a_prompt_far_over_the_context_is_refused_by_its_size(server):
    """Megabytes of prompt are refused by a bound on their token count, without rendering or tokenizing them."""
    chat = requests.post(f"{server.base_url}/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "hi"}] * 600, "max_tokens": 1})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert chat.json()["error"]["message"].startswith("messages: 600 turns cannot fit")
    text = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "word " * 1_000_000})
    assert text.status_code == 400 and text.json()["error"]["param"] == "prompt"
    assert "512 tokens, and the prompt has at least" in text.json()["error"]["message"]


def test_echoed_reasoning_items_do_not_count_as_turns(server):
    items = [{"type": "reasoning", "id": f"rs_{i}", "summary": []} for i in range(600)]
    response = requests.post(f"{server.base_url}/v1/responses",
                             json={"input": [*items, {"role": "user", "content": "hi"}], "max_output_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["output_tokens"] == 2


@pytest.mark.parametrize("body", [{"text": []}, {"input_ids": []}, {"input_ids": [[]]}, {"text": [""]}])
def test_empty_generate_prompts_are_400(server, body):
    """Found by the fuzz suite: an empty prompt list once crashed the router with a 500."""
    r = requests.post(f"{server.base_url}/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/files/file-a%00b", "/v1/files/" + "f" * 10_000 + "/content",
                                  "/v1/batches/batch_%00", "/v1/batches/" + "b" * 10_000])
def test_ids_that_cannot_exist_are_404_in_openai_shape(server, path):
    r = requests.get(f"{server.base_url}{path}")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_clients_cannot_upload_batch_output_files(server):
    """batch_output files are the server's own; an upload under that purpose would skip the batch limits."""
    r = requests.post(f"{server.base_url}/v1/files", files={"file": ("x.jsonl", b"{}\n")},
                      data={"purpose": "batch_output"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"


def test_a_reused_rid_never_reaches_the_request_in_flight(server):
    """Two /generate streams with the same rid run side by side, each to its own end."""
    body = {"text": "hi", "rid": "same", "stream": True, "sampling_params": {"max_new_tokens": 24,
                                                                               "temperature": 0, "ignore_eos": True}}
    with requests.post(f"{server.base_url}/generate", json=body, stream=True) as first, \
            requests.post(f"{server.base_url}/generate", json=body, stream=True) as second:
        events = [[json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
                  for r in (first, second)]
    for stream in events:
        assert stream[-1]["meta_info"]["id"] == "same" and len(stream[-1]["output_ids"]) == 24
    assert events[0][-1]["output_ids"] == events[1][-1]["output_ids"]


def test_the_replica_runs_with_a_short_openmp_spin(server):
    """builder.py gives replicas GOMP_SPINCOUNT (their idle OpenMP workers would otherwise spin on shared cores)."""
    pid = server.engine_stats()["pid"]
    environ = dict(item.split("=", 1) for item in open(f"/proc/{pid}/environ").read().split("\0") if "=" in item)
    assert environ.get("GOMP_SPINCOUNT") == "10000"
