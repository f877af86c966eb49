"""Embeddings: the engine's pooled final hidden states equal transformers' `AutoModel` last hidden state pooled and
normalised (last token, mean), chunked prefill included; an embedding request mixed into a generation's steps
leaves its greedy tokens unchanged; the pooling a sentence-transformers checkpoint declares is read. Served:
/v1/embeddings through the `openai` SDK equals the offline engine; the routes a model does not serve are 400s."""

import base64
import json
import shutil
import struct

import pytest
import requests
import torch
from transformers import AutoModel

from runtime import LLM, InvalidInputError, SamplingParams
from runtime.pooling import PoolerConfig
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args
from tests.model_factory import kv_cache_bytes

WORDS = "the capital of France is Paris and the sky is blue because of scattering".split()
MAX_BATCHED = 32


def _prompts(tokenizer) -> list[list[int]]:
    texts = [" ".join(WORDS[i % len(WORDS)] for i in range(k, k + length)) for k, length in ((0, 3), (5, 12), (2, 60))]
    prompts = [tokenizer.encode(t) for t in texts] + [[7]]
    assert max(map(len, prompts)) > MAX_BATCHED  # one prompt is prefilled in chunks
    return prompts


def _reference(path, prompts, pooling_type: str, normalize: bool = True) -> list[torch.Tensor]:
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
            vector = hidden[-1] if pooling_type == "last" else hidden.mean(0)
            out.append(torch.nn.functional.normalize(vector, dim=-1) if normalize else vector)
    return out


def _llm(path, **kwargs) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=256, max_num_batched_tokens=MAX_BATCHED,
               kv_cache_bytes=kv_cache_bytes(path, num_blocks=64), runner="pooling", **kwargs)


def _assert_close(ours: list[list[float]], expected: list[torch.Tensor]) -> None:
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(torch.tensor(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling_type", ["last", "mean"])
def test_embeddings_equal_transformers_pooled_hidden_states(qwen2_model, pooling_type):
    llm = _llm(qwen2_model, pooler_config={"pooling_type": pooling_type})
    prompts = _prompts(llm.tokenizer)
    expected = _reference(qwen2_model, prompts, pooling_type)
    _assert_close(llm.embed(prompts), expected)
    _assert_close(llm.embed(prompts), expected)  # again, now over the prefix cache (mean pooling takes no hit)
    stats = llm.engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["num_requests"] == 0
    if pooling_type == "last":
        assert stats["prefix_cache_hit_tokens"] > 0


def test_unnormalised_embeddings_and_a_prompt_filling_the_context(qwen2_model):
    llm = _llm(qwen2_model, pooler_config={"pooling_type": "mean", "normalize": False})
    prompt = [(i * 37) % 500 for i in range(256)]  # the whole context: nothing is generated after it
    _assert_close(llm.embed([prompt]), _reference(qwen2_model, [prompt], "mean", normalize=False))
    with pytest.raises(InvalidInputError, match="input"):
        llm.embed([prompt + [1]])
    with pytest.raises(InvalidInputError, match="input"):
        llm.embed([[]])


def test_an_embedding_mixed_with_decode_leaves_greedy_tokens_unchanged(qwen2_model):
    llm = _llm(qwen2_model)
    engine = llm.engine
    prompt = llm.tokenizer.encode("the sky is blue because")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].outputs[0].token_ids
    embed_prompt = _prompts(llm.tokenizer)[2]
    engine.add_request("gen", prompt, params)
    tokens, embedding, mixed_steps = [], None, 0
    while engine.has_unfinished_requests():
        if len(tokens) == 2:
            engine.enqueue("emb", engine.validate_embedding(embed_prompt))
        mixed_steps += "emb" in engine.requests and "gen" in engine.requests
        for delta in engine.step():
            if delta.request_id == "gen":
                tokens += delta.seqs[0].token_ids
            else:
                embedding = delta.embedding
    assert tokens == alone
    assert mixed_steps >= 2  # the embedding's prompt was prefilled in chunks beside the decodes
    _assert_close([embedding], _reference(qwen2_model, [embed_prompt], "last"))
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_tp2_embeddings_equal_tp1(ray_cluster, qwen2_model):
    llm = _llm(qwen2_model, pooler_config={"pooling_type": "mean"}, tensor_parallel_size=2)
    try:
        prompts = _prompts(llm.tokenizer)
        _assert_close(llm.embed(prompts), _reference(qwen2_model, prompts, "mean"))
    finally:
        llm.shutdown()


def test_pooling_read_from_a_sentence_transformers_checkpoint(qwen2_model, tmp_path):
    path = tmp_path / "st"
    shutil.copytree(qwen2_model, path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert PoolerConfig().resolve(path) == PoolerConfig("mean", False)
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    assert PoolerConfig().resolve(path) == PoolerConfig("mean", True)
    assert PoolerConfig("last").resolve(path) == PoolerConfig("last", True)  # the engine option wins
    assert PoolerConfig().resolve(qwen2_model) == PoolerConfig("last", True)  # Qwen3-Embedding's pooling
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(InvalidInputError, match="pooler_config"):
        PoolerConfig().resolve(path)
    with pytest.raises(InvalidInputError, match="pooler_config"):
        PoolerConfig.parse({"pooling_type": "max"})


# --- served: /v1/embeddings through the openai SDK -----------------------------------------------------------


@pytest.fixture(scope="module")
def embedder(server, tmp_path_factory):
    """An app beside the shared one serving the shared server's tiny model as an embedding model."""
    import openai

    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('embed-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "runner": "pooling"}
    with another_app(server, "embed", args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None")


@pytest.fixture(scope="module")
def offline(server):
    return LLM(str(server.model_dir), runner="pooling", **ENGINE_KWARGS)


def test_served_embeddings_equal_the_offline_engine(embedder, offline):
    texts = ["the sky is blue", "Paris is the capital of France and Tokyo of Japan", "hi"]
    expected = offline.embed(texts)
    for encoding in ({"encoding_format": "float"}, {}):  # unasked, the SDK asks for base64 and decodes it
        reply = embedder.embeddings.create(model=MODEL_ID, input=texts, user="someone", **encoding)
        assert reply.object == "list" and reply.model == MODEL_ID
        assert [d.index for d in reply.data] == [0, 1, 2] and {d.object for d in reply.data} == {"embedding"}
        _assert_close([d.embedding for d in reply.data], [torch.tensor(e) for e in expected])
        tokens = sum(len(offline.tokenizer.encode(t)) for t in texts)
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    raw = requests.post(f"{embedder.base_url}embeddings", json={"input": "hi", "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    _assert_close([list(struct.unpack(f"<{len(packed) // 4}f", packed))], [torch.tensor(expected[2])])

    short = embedder.embeddings.create(model=MODEL_ID, input=texts[1], dimensions=16, encoding_format="float")
    truncated = torch.nn.functional.normalize(torch.tensor(expected[1][:16]), dim=-1)
    _assert_close([short.data[0].embedding], [truncated])

    ids = [offline.tokenizer.encode(t) for t in texts]
    one = embedder.embeddings.create(model=MODEL_ID, input=ids[0], encoding_format="float")
    many = embedder.embeddings.create(model=MODEL_ID, input=ids, encoding_format="float")
    _assert_close([one.data[0].embedding], [torch.tensor(expected[0])])
    _assert_close([d.embedding for d in many.data], [torch.tensor(e) for e in expected])


def test_served_embeddings_refusals(embedder, client):
    import openai

    def refused(call, param: str) -> str:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == param, e.value.body
        return e.value.body["message"]

    assert "not an embedding model" in refused(lambda: client.embeddings.create(model=MODEL_ID, input="hi"), "model")
    for call in (lambda: embedder.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}]),
                 lambda: embedder.completions.create(model=MODEL_ID, prompt="hi"),
                 lambda: embedder.chat.completions.create(model=MODEL_ID, stream=True,
                                                          messages=[{"role": "user", "content": "hi"}])):
        assert "embedding model" in refused(call, "model")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input="hi", dimensions=65), "dimensions")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input=[[1] * 513]), "input")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input=[[70_000]]), "input")
    with pytest.raises(openai.BadRequestError):
        embedder.embeddings.create(model=MODEL_ID, input=["hi"] * 1025)
    with pytest.raises(openai.BadRequestError):
        embedder.embeddings.create(model=MODEL_ID, input=[])


def test_batch_lines_may_target_embeddings(embedder, offline):
    """OpenAI's Batch API takes /v1/embeddings lines; their bodies are the route's replies."""
    from tests.test_batches import finished, jsonl, read_jsonl

    texts = ["the sky is blue", "hi"]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL_ID, "input": text, "encoding_format": "float"}} for i, text in enumerate(texts)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL_ID}})
    upload = embedder.files.create(file=("embed.jsonl", jsonl(lines)), purpose="batch")
    batch = finished(embedder, embedder.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                                       completion_window="24h").id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    results = read_jsonl(embedder, batch.output_file_id)
    assert [r["custom_id"] for r in results] == ["e0", "e1"]
    vectors = [r["response"]["body"]["data"][0]["embedding"] for r in results]
    _assert_close(vectors, [torch.tensor(e) for e in offline.embed(texts)])
    (error,) = read_jsonl(embedder, batch.error_file_id)
    assert error["custom_id"] == "bad" and "input" in error["error"]["message"]
