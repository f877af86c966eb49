"""vLLM's /tokenize and /detokenize on the served app: the ids the engine itself would use, and back."""

import requests
from transformers import AutoTokenizer

from tests.conftest import MODEL_ID

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


def post(server, path: str, **body) -> requests.Response:
    return requests.post(f"{server.base_url}{path}", json={"model": MODEL_ID, **body})


def test_a_prompt_is_the_models_own_tokens_and_comes_back(server):
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
    text = "The capital of France is Paris."
    reply = post(server, "/tokenize", prompt=text, return_token_strs=True).json()
    assert reply["tokens"] == tokenizer.encode(text) and reply["count"] == len(reply["tokens"])
    assert reply["max_model_len"] == server.engine_kwargs["max_model_len"]
    assert reply["token_strs"] == tokenizer.convert_ids_to_tokens(reply["tokens"])
    assert post(server, "/detokenize", tokens=reply["tokens"]).json() == {"prompt": tokenizer.decode(reply["tokens"])}


def test_messages_are_what_a_chat_completion_would_prompt_with(server, client):
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
    reply = post(server, "/tokenize", messages=MESSAGES).json()
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert reply["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    chat = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=1)
    assert chat.usage.prompt_tokens == reply["count"]
    assert post(server, "/tokenize", messages=MESSAGES, add_generation_prompt=False).json()["count"] < reply["count"]


def test_bad_tokenize_and_detokenize_bodies_are_400_or_404(server):
    cases = [("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, None),
             ("/tokenize", {}, 400, None),
             ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
             ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
             ("/detokenize", {"tokens": [1] * 100_000}, 400, "tokens"),
             ("/tokenize", {"prompt": "x", "model": "no-such-model"}, 404, "model")]
    for path, body, status, param in cases:
        reply = post(server, path, **body)
        assert reply.status_code == status, (path, body, reply.text)
        assert param is None or reply.json()["error"]["param"] == param
