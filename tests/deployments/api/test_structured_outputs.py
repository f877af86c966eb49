"""Structured outputs through the SDK on a random-weight model, where only the constraint can make them hold."""

import ast
import asyncio
import json
import re

import jsonschema
import openai
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import MODEL_ID

USER_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "age", "admin", "color", "tags"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "user", "schema": USER_SCHEMA}}
PLATE = r"[A-Z]{2}-\d{3}-[a-z]{2}"
ARITHMETIC = """root ::= expr
expr ::= term (("+" | "*") term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]?"""


def test_fifty_seeded_json_schema_samples_all_validate(server):
    client = openai.AsyncClient(base_url=server.openai_url, api_key="None")

    async def sample(seed):
        r = await client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Give me a user as JSON."}],
            response_format=RESPONSE_FORMAT, temperature=1.0, seed=seed, max_tokens=300)
        return r.choices[0]

    async def main():
        return await asyncio.gather(*(sample(seed) for seed in range(50)))

    choices = asyncio.run(main())
    texts = set()
    for choice in choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), USER_SCHEMA)
        texts.add(choice.message.content)
    assert len(texts) > 40  # the samples differ: the grammar constrains, the seed varies


def test_json_schema_streaming_and_json_object(client):
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "user?"}], response_format=RESPONSE_FORMAT,
        temperature=0.8, seed=7, max_tokens=300, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), USER_SCHEMA)
    obj = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "any JSON"}], response_format={"type": "json_object"},
        temperature=0.7, seed=1, max_tokens=400)
    assert obj.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_regex_and_ebnf_through_extra_body(client):
    for seed in range(5):
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "plate"}],
                                           temperature=1.0, seed=seed, max_tokens=40, extra_body={"regex": PLATE})
        assert re.fullmatch(PLATE, r.choices[0].message.content)
        c = client.completions.create(model=MODEL_ID, prompt="Expression:", temperature=1.0, seed=seed,
                                      max_tokens=60, extra_body={"ebnf": ARITHMETIC})
        expression = c.choices[0].text
        assert c.choices[0].finish_reason == "stop"
        tree = ast.parse(expression, mode="eval")  # the output is a well-formed expression
        assert all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Mult)) for n in ast.walk(tree))
    stream = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "plate"}],
                                            temperature=1.0, seed=11, max_tokens=40, stream=True,
                                            extra_body={"regex": PLATE})
    assert re.fullmatch(PLATE, "".join(c.choices[0].delta.content or "" for c in stream if c.choices))


def test_native_generate_constraints(server):
    for key, value, check in [
        ("regex", PLATE, lambda t: re.fullmatch(PLATE, t)),
        ("json_schema", json.dumps(USER_SCHEMA), lambda t: jsonschema.validate(json.loads(t), USER_SCHEMA) is None),
    ]:
        r = requests.post(f"{server.base_url}/generate", json={
            "text": "Output:", "sampling_params": {"max_new_tokens": 300, "temperature": 1.0, key: value}}).json()
        assert check(r["text"]) and r["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"regex": "([a-z"}, "regex"),
    ({"ebnf": "root ::= undefined_rule"}, "ebnf"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "([a-z"}, "guided_regex"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])
def test_invalid_constraints_are_400s_naming_the_field(server, body, param):
    r = requests.post(f"{server.openai_url}/chat/completions",
                      json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_logprobs_equal_transformers(server, client):
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
    messages = [{"role": "user", "content": "Question: what is 2 + 2?"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=8,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    generated = []
    for entry in content:
        with torch.no_grad():
            row = torch.log_softmax(model(torch.tensor([ids + generated])).logits[0, -1], dim=-1)
        token = int(row.argmax())
        assert entry.logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert entry.bytes == list(tokenizer.decode([token]).encode("utf-8"))
        top = row.topk(3)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        generated.append(token)
