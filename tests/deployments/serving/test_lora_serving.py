"""LoRA adapters through the public API: adapters staged in S3 (moto's server), named as `<model_id>:<adapter>`,
listed by /v1/models, giving the offline engine's tokens for the same adapter, through two slots for three
adapters, in a batch line, as a Messages request's model; unknown and malformed adapters are OpenAI-shaped 404s
and 400s and disturb nobody."""

import json

import anthropic
import boto3
import openai
import pytest
import requests

from runtime import LLM, LoRARequest, SamplingParams
from testing.helpers import wait_until
from testing.lora_adapters import make_adapter
from tests.conftest import MODEL_ID, another_app, app_args
from tests.deployments.serving.test_serving_modes import assert_messages_create_and_stream

BUCKET = "lora-adapters"
NAMES = ["alpha", "beta", "gamma"]
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def staged(server, s3_endpoint, tmp_path_factory):
    """Three random PEFT adapters of the served model, uploaded to S3; their local copies for the reference."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    local = {}
    for seed, name in enumerate(NAMES):
        path = tmp_path_factory.mktemp(f"adapter-{name}")
        make_adapter(server.model_dir, path, 4 + 4 * seed, 8, ["q_proj", "v_proj", "down_proj"], False, seed)
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            s3.upload_file(str(path / file), BUCKET, f"adapters/{name}/{file}")
        local[name] = path
    bad = json.loads((local["alpha"] / "adapter_config.json").read_text())
    s3.put_object(Bucket=BUCKET, Key="adapters/too-big/adapter_config.json", Body=json.dumps({**bad, "r": 999}))
    s3.upload_file(str(local["alpha"] / "adapter_model.safetensors"), BUCKET,
                   "adapters/too-big/adapter_model.safetensors")
    return local


@pytest.fixture(scope="module")
def lora_app(server, staged, tmp_path_factory):
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('lora-storage')}")
    args["llm_configs"][0]["lora_config"] = {"dynamic_lora_loading_path": f"s3://{BUCKET}/adapters",
                                             "max_num_adapters_per_replica": 2, "max_lora_rank": 16}
    with another_app(server, "lora", args) as url:
        yield url


def offline_tokens(server, staged, name: str | None) -> list[int]:
    from tests.conftest import ENGINE_KWARGS

    llm = LLM(str(server.model_dir), enable_lora=True, **ENGINE_KWARGS)
    prompt = llm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = llm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    lora = LoRARequest(name, str(staged[name])) if name else None
    return llm.generate(ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), lora_request=lora)[0] \
        .outputs[0].token_ids


def chat_tokens(url: str, model: str) -> list[int]:
    r = requests.post(f"{url}/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 8,
                                                          "temperature": 0, "ignore_eos": True,
                                                          "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model  # an adapter's reply names the adapter, as vLLM's
    return r.json()["choices"][0]["token_ids"]


def test_models_lists_the_adapters_in_s3(lora_app):
    ids = [m["id"] for m in requests.get(f"{lora_app}/v1/models").json()["data"]]
    assert ids == [MODEL_ID, *(f"{MODEL_ID}:{n}" for n in sorted(NAMES + ["too-big"]))]
    card = requests.get(f"{lora_app}/v1/models/{MODEL_ID}:beta").json()
    assert card["parent"] == MODEL_ID and card["root"] == f"s3://{BUCKET}/adapters/beta"


def test_adapters_from_s3_give_the_offline_engines_tokens_through_two_slots(server, staged, lora_app):
    expected = {name: offline_tokens(server, staged, name) for name in [*NAMES, None]}
    assert len({tuple(t) for t in expected.values()}) == 4  # each adapter changes the output
    for name in NAMES + NAMES[::-1] + [None]:  # three adapters through two slots, then the base
        assert chat_tokens(lora_app, f"{MODEL_ID}:{name}" if name else MODEL_ID) == expected[name]
    client = openai.Client(base_url=f"{lora_app}/v1", api_key="x")
    streamed = list(client.chat.completions.create(model=f"{MODEL_ID}:gamma", messages=MESSAGES, max_tokens=8,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True,
                                                                                           "return_token_ids": True}))
    assert [t for c in streamed for ch in c.choices for t in (ch.model_extra.get("token_ids") or [])] == \
        expected["gamma"]


@pytest.mark.parametrize("model, status", [(f"{MODEL_ID}:nope", 404), (f"{MODEL_ID}:../alpha", 404),
                                           (f"{MODEL_ID}:too-big", 400)])
def test_unknown_and_malformed_adapters_are_openai_errors(lora_app, server, model, status):
    r = requests.post(f"{lora_app}/v1/chat/completions", json={"model": model, "messages": MESSAGES})
    assert r.status_code == status and r.json()["error"]["param"] == "model", r.text
    no_lora = requests.post(f"{server.base_url}/v1/chat/completions", json={"model": f"{MODEL_ID}:alpha",
                                                                            "messages": MESSAGES})
    assert no_lora.status_code == 404  # a model without lora_config has no adapters
    assert chat_tokens(lora_app, f"{MODEL_ID}:alpha")  # the replica goes on


def test_a_batch_line_names_an_adapter(server, staged, lora_app):
    client = openai.Client(base_url=f"{lora_app}/v1", api_key="x")
    lines = [{"custom_id": name, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": f"{MODEL_ID}:{name}", "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True}} for name in NAMES]
    uploaded = client.files.create(file=("l.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b, 120)
    rows = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    got = {row["custom_id"]: row["response"]["body"]["choices"][0]["token_ids"] for row in rows}
    assert got == {name: chat_tokens(lora_app, f"{MODEL_ID}:{name}") for name in NAMES}


def test_a_message_names_an_adapter(lora_app):
    """messages.create and messages.stream with `<model_id>:<adapter>`: the adapter's chat reply, in Anthropic's
    shapes, naming the adapter; an unknown adapter is Anthropic's not_found_error."""
    claude = anthropic.Anthropic(base_url=lora_app, api_key="x")
    model = f"{MODEL_ID}:beta"
    assert_messages_create_and_stream(claude, model)
    kwargs = dict(max_tokens=8, messages=MESSAGES, extra_body={"temperature": 0, "ignore_eos": True})
    texts = {name: claude.messages.create(model=name, **kwargs).content[0].text for name in (model, MODEL_ID)}
    chat = requests.post(f"{lora_app}/v1/chat/completions", json={"model": model, "messages": MESSAGES,
                                                                   "max_tokens": 8, "temperature": 0,
                                                                   "ignore_eos": True}).json()
    assert texts[model] == chat["choices"][0]["message"]["content"] != texts[MODEL_ID]
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model=f"{MODEL_ID}:nope", **kwargs)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    response = openai.Client(base_url=f"{lora_app}/v1", api_key="x").responses.create(model=model, input="hi",
                                                                                       max_output_tokens=2)
    assert response.model == model  # the Responses API names the adapter too


def test_each_adapter_is_served_by_one_of_two_replicas(server, staged, tmp_path_factory):
    from ray import serve

    from deployments.app_config import replica_name

    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('lora2-storage')}")
    args["llm_configs"][0]["lora_config"] = {"dynamic_lora_loading_path": f"s3://{BUCKET}/adapters",
                                             "max_num_adapters_per_replica": 4}
    args["llm_configs"][0]["deployment_config"] = {"num_replicas": 2}
    with another_app(server, "lora2", args) as url:
        for _ in range(4):
            for name in NAMES:
                chat_tokens(url, f"{MODEL_ID}:{name}")
        handle = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="lora2")
        replicas = {}
        for _ in range(100):  # ask until both replicas have answered
            stats = handle.stats.remote().result()
            replicas[stats["pid"]] = stats["lora_adapters_loaded"]
            if len(replicas) == 2:
                break
    assert len(replicas) == 2
    loaded = [name for names in replicas.values() for name in names]
    assert sorted(loaded) == sorted(NAMES)  # each adapter on exactly one replica: 12 requests, 3 loads
