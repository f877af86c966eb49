"""vLLM's scoring routes served: /score, /rerank (Jina's /v1 and Cohere's /v2 paths, Cohere's SDK), /classify and
/pooling on a tiny Qwen3 made a reranker by Qwen3-Reranker's `hf_overrides`, and /score and /rerank on the
embedding app (cosines), each equal to transformers; a batch of /v1/score and /v1/rerank lines answers as the
routes do; what a model does not serve, and bad bodies, are 400s naming the field."""

import cohere
import pytest
import requests
import torch
from transformers import AutoModel, AutoTokenizer

from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args
from tests.runtime.test_scoring import DOCS, QUERY, RERANKER, reranker_dir, reranker_reference


@pytest.fixture(scope="module")
def reranker_model(tmp_path_factory):
    return reranker_dir(tmp_path_factory.mktemp("served_reranker"))


@pytest.fixture(scope="module")
def reranker_url(server, reranker_model, tmp_path_factory):
    """The base URL of an app beside the shared one serving the reranker (at /reranker)."""
    args = app_args(reranker_model, f"file://{tmp_path_factory.mktemp('reranker-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "runner": "pooling", "hf_overrides": RERANKER}
    with another_app(server, "reranker", args) as url:
        yield url


def post(url: str, body: dict) -> dict:
    reply = requests.post(url, json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def refused(url: str, body: dict, param: str) -> str:
    reply = requests.post(url, json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


def test_score_equals_transformers(reranker_url, reranker_model):
    expected = reranker_reference(reranker_model, [(QUERY, d) for d in DOCS])
    for path, sides in (("/score", {"text_1": QUERY, "text_2": DOCS}),
                        ("/v1/score", {"queries": [QUERY] * 3, "documents": DOCS}),
                        ("/score", {"data_1": QUERY, "data_2": DOCS})):
        reply = post(reranker_url + path, {"model": MODEL_ID, **sides})
        assert reply["id"].startswith("score-") and reply["object"] == "list" and reply["model"] == MODEL_ID
        assert [(d["index"], d["object"]) for d in reply["data"]] == [(0, "score"), (1, "score"), (2, "score")]
        torch.testing.assert_close(torch.tensor([d["score"] for d in reply["data"]]), torch.tensor(expected))
        tokenizer = AutoTokenizer.from_pretrained(reranker_model)
        tokens = sum(len(tokenizer(QUERY + d)["input_ids"]) for d in DOCS)
        assert reply["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    logits = post(reranker_url + "/score", {"text_1": QUERY, "text_2": DOCS[0], "use_activation": False})
    assert torch.tensor(logits["data"][0]["score"]).sigmoid().item() == pytest.approx(expected[0], abs=1e-5)


def test_rerank_orders_documents_by_score(reranker_url, reranker_model):
    expected = reranker_reference(reranker_model, [(QUERY, d) for d in DOCS])
    order = sorted(range(3), key=lambda i: -expected[i])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        reply = post(reranker_url + path, {"model": MODEL_ID, "query": QUERY, "documents": DOCS})
        assert set(reply) == {"id", "model", "usage", "results"} and reply["id"].startswith("rerank-")
        assert [r["index"] for r in reply["results"]] == order
        assert [r["document"] for r in reply["results"]] == [{"text": DOCS[i]} for i in order]
        torch.testing.assert_close(torch.tensor([r["relevance_score"] for r in reply["results"]]),
                                   torch.tensor([expected[i] for i in order]))
    best = post(reranker_url + "/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 1,
                                           "return_documents": False})
    assert best["results"] == [{"index": order[0], "relevance_score": pytest.approx(expected[order[0]], abs=1e-5)}]
    cut = post(reranker_url + "/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 2})
    tokenizer = AutoTokenizer.from_pretrained(reranker_model)
    short = [tokenizer.decode(tokenizer.encode(d)[:2]) for d in DOCS]
    assert sorted(r["relevance_score"] for r in cut["results"]) == pytest.approx(
        sorted(reranker_reference(reranker_model, [(QUERY, d) for d in short])), abs=1e-5)
    assert {r["document"]["text"] for r in cut["results"]} == set(DOCS)  # the documents as sent


def test_cohere_sdk_reranks(reranker_url, reranker_model):
    expected = reranker_reference(reranker_model, [(QUERY, d) for d in DOCS])
    client = cohere.ClientV2(api_key="None", base_url=reranker_url)
    reply = client.rerank(model=MODEL_ID, query=QUERY, documents=DOCS, top_n=2)
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r.index for r in reply.results] == order
    assert [r.relevance_score for r in reply.results] == pytest.approx([expected[i] for i in order], abs=1e-5)


def test_classify_and_pooling(reranker_url, reranker_model):
    expected = reranker_reference(reranker_model, [(QUERY, d) for d in DOCS])
    texts = [QUERY + d for d in DOCS]
    reply = post(reranker_url + "/classify", {"model": MODEL_ID, "input": texts})
    assert reply["id"].startswith("classify-") and reply["object"] == "list"
    assert [(d["index"], d["label"], d["num_classes"]) for d in reply["data"]] == [(i, "LABEL_0", 1) for i in range(3)]
    assert [d["probs"][0] for d in reply["data"]] == pytest.approx(expected, abs=1e-5)
    pooled = post(reranker_url + "/pooling", {"input": texts[0]})
    assert pooled["id"].startswith("pool-") and pooled["data"][0]["object"] == "pooling"
    assert pooled["data"][0]["data"] == pytest.approx(expected[:1], abs=1e-5)
    raw = post(reranker_url + "/pooling", {"input": texts[0], "use_activation": False})["data"][0]["data"]
    assert torch.tensor(raw).sigmoid().tolist() == pytest.approx(expected[:1], abs=1e-5)


def test_embedding_app_scores_by_cosine(embedder, qwen3_embedding):
    url = str(embedder.base_url).removesuffix("/v1/")
    tokenizer = AutoTokenizer.from_pretrained(qwen3_embedding)
    model = AutoModel.from_pretrained(qwen3_embedding, dtype=torch.float32)
    with torch.no_grad():
        vectors = [model(torch.tensor([tokenizer.encode(t)])).last_hidden_state[0, -1] for t in [QUERY, *DOCS]]
    expected = [torch.nn.functional.cosine_similarity(vectors[0], v, dim=0).item() for v in vectors[1:]]
    reply = post(url + "/score", {"text_1": QUERY, "text_2": DOCS})
    assert [d["score"] for d in reply["data"]] == pytest.approx(expected, abs=1e-5)
    tokens = sum(len(tokenizer.encode(t)) for t in [QUERY, *DOCS])  # the query embedded once
    assert reply["usage"]["prompt_tokens"] == tokens
    ranked = post(url + "/v2/rerank", {"query": QUERY, "documents": DOCS})["results"]
    assert [r["relevance_score"] for r in ranked] == pytest.approx(sorted(expected, reverse=True), abs=1e-5)
    assert "is not a classifier" in refused(url + "/classify", {"input": "hi"}, "model")


def test_refusals(reranker_url, server):
    assert "not a pooling model" in refused(server.base_url + "/score", {"text_1": "a", "text_2": "b"}, "model")
    assert "not a pooling model" in refused(server.base_url + "/rerank", {"query": "a", "documents": ["b"]}, "model")
    refused(reranker_url + "/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2")
    refused(reranker_url + "/score", {"text_1": [], "text_2": ["c"]}, "text_1")
    refused(reranker_url + "/rerank", {"query": "a", "documents": []}, "documents")
    refused(reranker_url + "/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n")
    refused(reranker_url + "/rerank", {"documents": ["b"]}, "query")
    refused(reranker_url + "/score", {"text_1": "a", "text_2": [" ".join(["the sky is blue"] * 300)]}, "input")
    refused(reranker_url + "/classify", {"input": []}, "input")


def test_batch_of_score_and_rerank_lines(reranker_url, reranker_model):
    """OpenAI's Batch API takes /v1/score and /v1/rerank lines (as vLLM's batch runner does); their bodies are
    the routes' replies."""
    import openai

    from tests.deployments.batch.test_batches import finished, jsonl, read_jsonl

    client = openai.Client(base_url=f"{reranker_url}/v1", api_key="None")
    expected = reranker_reference(reranker_model, [(QUERY, d) for d in DOCS])
    for endpoint, body in (("/v1/score", {"text_1": QUERY, "text_2": DOCS}),
                           ("/v1/rerank", {"query": QUERY, "documents": DOCS})):
        lines = [{"custom_id": "ok", "method": "POST", "url": endpoint, "body": {"model": MODEL_ID, **body}},
                 {"custom_id": "bad", "method": "POST", "url": endpoint, "body": {"model": MODEL_ID}}]
        upload = client.files.create(file=("scores.jsonl", jsonl(lines)), purpose="batch")
        batch = finished(client, client.batches.create(input_file_id=upload.id, endpoint=endpoint,
                                                       completion_window="24h").id)
        assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 1, 1)
        (result,) = read_jsonl(client, batch.output_file_id)
        reply = result["response"]["body"]
        scores = [d["score"] for d in reply["data"]] if endpoint == "/v1/score" else \
            [r["relevance_score"] for r in sorted(reply["results"], key=lambda r: r["index"])]
        assert scores == pytest.approx(expected, abs=1e-5)
