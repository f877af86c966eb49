"""Embeddings on a tiny random Qwen3 saved as Qwen3-Embedding is (`Qwen3Model`: no LM head, tensor names without
the `model.` prefix, sentence-transformers' last-token Pooling and Normalize modules): the engine's pooled final
hidden states equal transformers' `Qwen3Model` last hidden state pooled the same way (last token, mean; chunked
prefill and TP=2 included); an embedding request mixed into a generation's steps leaves its greedy tokens
unchanged; the pooling a sentence-transformers checkpoint declares is read. Served: /v1/embeddings through the
`openai` SDK and a batch file equal transformers (dimensions and base64 included); the routes a model does not
serve are 400s."""

import base64
import json
import shutil
import struct

import pytest
import requests
import torch
from transformers import AutoModel, AutoTokenizer

from runtime import LLM, InvalidInputError, SamplingParams
from runtime.pooling import PoolerConfig
from testing.model_factory import kv_cache_bytes, write_sentence_transformers_modules
from tests.conftest import MODEL_ID

WORDS = "the capital of France is Paris and the sky is blue because of scattering".split()
MAX_BATCHED = 32


def _prompts(tokenizer) -> list[list[int]]:
    texts = [" ".join(WORDS[i % len(WORDS)] for i in range(k, k + length)) for k, length in ((0, 3), (5, 12), (2, 60))]
    prompts = [tokenizer.encode(t) for t in texts] + [[7]]
    assert max(map(len, prompts)) > MAX_BATCHED  # one prompt is prefilled in chunks
    return prompts


def _reference(path, prompts, pooling_type: str = "last", normalize: bool = True) -> list[torch.Tensor]:
    """transformers' base model's last hidden state, pooled."""
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
        got = torch.tensor(got)
        assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.9999
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling_type", ["last", "mean"])
def test_embeddings_equal_transformers_pooled_hidden_states(qwen3_embedding, pooling_type):
    llm = _llm(qwen3_embedding, pooler_config={"pooling_type": pooling_type})
    prompts = _prompts(llm.tokenizer)
    expected = _reference(qwen3_embedding, prompts, pooling_type)
    _assert_close(llm.embed(prompts), expected)
    _assert_close(llm.embed(prompts), expected)  # again, now over the prefix cache (mean pooling takes no hit)
    stats = llm.engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["num_requests"] == 0
    if pooling_type == "last":
        assert stats["prefix_cache_hit_tokens"] > 0


def test_unnormalised_embeddings_and_a_prompt_filling_the_context(qwen3_embedding):
    llm = _llm(qwen3_embedding, pooler_config={"pooling_type": "mean", "normalize": False})
    prompt = [(i * 37) % 500 for i in range(256)]  # the whole context: nothing is generated after it
    _assert_close(llm.embed([prompt]), _reference(qwen3_embedding, [prompt], "mean", normalize=False))
    with pytest.raises(InvalidInputError, match="input"):
        llm.embed([prompt + [1]])
    with pytest.raises(InvalidInputError, match="input"):
        llm.embed([[]])


def test_a_base_model_without_an_lm_head_only_embeds(qwen3_embedding):
    with pytest.raises(InvalidInputError, match="runner") as e:
        LLM(str(qwen3_embedding), max_model_len=256)
    assert "Qwen3Model has no LM head" in str(e.value)
    with pytest.raises(InvalidInputError, match="no LM head"):
        _llm(qwen3_embedding).generate([[1, 2]], SamplingParams(max_tokens=1))


def test_an_embedding_mixed_with_decode_leaves_greedy_tokens_unchanged(qwen2_model):
    """A causal LM's checkpoint embeds too (its last norm's output), beside its own generations."""
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
            engine.enqueue("emb", engine.validator.validate_embedding(embed_prompt))
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


def test_tp2_embeddings_equal_tp1(ray_cluster, qwen3_embedding):
    llm = _llm(qwen3_embedding, pooler_config={"pooling_type": "mean"}, tensor_parallel_size=2)
    try:
        prompts = _prompts(llm.tokenizer)
        _assert_close(llm.embed(prompts), _reference(qwen3_embedding, prompts, "mean"))
    finally:
        llm.shutdown()


def test_pooling_read_from_a_sentence_transformers_checkpoint(qwen3_embedding, qwen2_model, tmp_path):
    assert PoolerConfig().resolve(qwen3_embedding) == PoolerConfig("last", True)
    assert PoolerConfig().resolve(qwen2_model) == PoolerConfig("last", True)  # none declared: Qwen3-Embedding's
    path = tmp_path / "st"
    shutil.copytree(qwen3_embedding, path)
    write_sentence_transformers_modules(path, "pooling_mode_mean_tokens", normalize=False)
    assert PoolerConfig().resolve(path) == PoolerConfig("mean", False)
    prompts = _prompts(AutoTokenizer.from_pretrained(path))
    _assert_close(_llm(path).embed(prompts), _reference(path, prompts, "mean", normalize=False))
    write_sentence_transformers_modules(path, "pooling_mode_mean_tokens", normalize=True)
    assert PoolerConfig().resolve(path) == PoolerConfig("mean", True)
    assert PoolerConfig("last").resolve(path) == PoolerConfig("last", True)  # the engine option wins
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(InvalidInputError, match="pooler_config"):
        PoolerConfig().resolve(path)
    with pytest.raises(InvalidInputError, match="pooler_config"):
        PoolerConfig.parse({"pooling_type": "max"})


# --- served: /v1/embeddings through the openai SDK and a batch file -------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_embedding):
    return AutoTokenizer.from_pretrained(qwen3_embedding)


TEXTS = ["the sky is blue", "Paris is the capital of France and Tokyo of Japan", "hi"]


def test_served_embeddings_equal_transformers(embedder, qwen3_embedding, tokenizer):
    ids = [tokenizer.encode(t) for t in TEXTS]
    expected = _reference(qwen3_embedding, ids)
    for encoding in ({"encoding_format": "float"}, {}):  # unasked, the SDK asks for base64 and decodes it
        reply = embedder.embeddings.create(model=MODEL_ID, input=TEXTS, user="someone", **encoding)
        assert reply.object == "list" and reply.model == MODEL_ID
        assert [d.index for d in reply.data] == [0, 1, 2] and {d.object for d in reply.data} == {"embedding"}
        _assert_close([d.embedding for d in reply.data], expected)
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))
    raw = requests.post(f"{embedder.base_url}embeddings", json={"input": "hi", "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert len(packed) == 64 * 4  # little-endian float32, the hidden size of them
    _assert_close([list(struct.unpack("<64f", packed))], [expected[2]])

    for dimensions in (16, 1, 64):
        for encoding in ("float", "base64"):
            short = embedder.embeddings.create(model=MODEL_ID, input=TEXTS[1], dimensions=dimensions,
                                               encoding_format=encoding)
            vector = short.data[0].embedding
            if encoding == "base64":
                vector = list(struct.unpack(f"<{dimensions}f", base64.b64decode(vector)))
            _assert_close([vector], [torch.nn.functional.normalize(expected[1][:dimensions], dim=-1)])

    one = embedder.embeddings.create(model=MODEL_ID, input=ids[0], encoding_format="float")
    many = embedder.embeddings.create(model=MODEL_ID, input=ids, encoding_format="float")
    _assert_close([one.data[0].embedding], [expected[0]])
    _assert_close([d.embedding for d in many.data], expected)


def test_served_embeddings_refusals(embedder, client):
    import openai

    def refused(call, param: str) -> str:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == param, e.value.body
        return e.value.body["message"]

    assert "not a pooling model" in refused(lambda: client.embeddings.create(model=MODEL_ID, input="hi"), "model")
    for call in (lambda: embedder.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}]),
                 lambda: embedder.completions.create(model=MODEL_ID, prompt="hi"),
                 lambda: embedder.chat.completions.create(model=MODEL_ID, stream=True,
                                                          messages=[{"role": "user", "content": "hi"}])):
        assert "a pooling model" in refused(call, "model")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input="hi", dimensions=65), "dimensions")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input=[[1] * 513]), "input")
    refused(lambda: embedder.embeddings.create(model=MODEL_ID, input=[[70_000]]), "input")
    with pytest.raises(openai.BadRequestError):
        embedder.embeddings.create(model=MODEL_ID, input=["hi"] * 1025)
    with pytest.raises(openai.BadRequestError):
        embedder.embeddings.create(model=MODEL_ID, input=[])


def test_batch_file_embeddings_equal_transformers(embedder, qwen3_embedding, tokenizer):
    """OpenAI's Batch API takes /v1/embeddings lines; their bodies are the route's replies."""
    from tests.deployments.batch.test_batches import finished, jsonl, read_jsonl

    expected = _reference(qwen3_embedding, [tokenizer.encode(t) for t in TEXTS])
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL_ID, "input": text, "encoding_format": "float"}} for i, text in enumerate(TEXTS)]
    lines[1]["body"].update(dimensions=16, encoding_format="base64")
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL_ID}})
    upload = embedder.files.create(file=("embed.jsonl", jsonl(lines)), purpose="batch")
    batch = finished(embedder, embedder.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                                       completion_window="24h").id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    results = read_jsonl(embedder, batch.output_file_id)
    assert [r["custom_id"] for r in results] == ["e0", "e1", "e2"]
    vectors = [r["response"]["body"]["data"][0]["embedding"] for r in results]
    vectors[1] = list(struct.unpack("<16f", base64.b64decode(vectors[1])))
    expected[1] = torch.nn.functional.normalize(expected[1][:16], dim=-1)
    _assert_close(vectors, expected)
    (error,) = read_jsonl(embedder, batch.error_file_id)
    assert error["custom_id"] == "bad" and "input" in error["error"]["message"]
