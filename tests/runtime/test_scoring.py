"""Classifiers and scoring against transformers on tiny random checkpoints: a `Qwen2ForSequenceClassification`
(three labels: its softmax; chunked prefill, TP=2 and PP=2 included), a Qwen3 causal LM made a reranker by
Qwen3-Reranker's `hf_overrides` (the softmax of its LM head's "no" and "yes" logits; tied embeddings too), a
causal LM whose one token's logit is its label (sigmoid), and an embedding model's cosine scores; what a
classifier or a scoring call cannot take is refused, naming the option or field."""

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from runtime import LLM, InvalidInputError, SamplingParams
from testing.model_factory import build_model_dir, kv_cache_bytes

TEXTS = ["the sky is blue", "Paris is the capital of France and Tokyo of Japan", "hi",
         " ".join(["the capital of France is Paris"] * 8)]  # longer than a prefill chunk
QUERY = "query: why is the sky blue"
DOCS = ["document: because of scattering", "document: Paris is the capital", "document: hi"]
RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "is_original_qwen3_reranker": True}
MAX_BATCHED = 32


def _llm(path, **kwargs) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=256, max_num_batched_tokens=MAX_BATCHED,
               kv_cache_bytes=kv_cache_bytes(path, num_blocks=64), runner="pooling", **kwargs)


def reranker_dir(path, tie_word_embeddings: bool = False):
    """A tiny Qwen3 causal LM whose tokenizer has Qwen3-Reranker's "no" and "yes" tokens."""
    path = build_model_dir(path, "qwen3", head_dim=32, tokenizer_vocab=500, tie_word_embeddings=tie_word_embeddings)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["no", "yes"])
    tokenizer.save_pretrained(path)
    return path


def reranker_reference(path, pairs: list[tuple[str, str]], tokens: tuple[str, str] = ("no", "yes")) -> list[float]:
    """transformers' causal LM: the softmax of the last position's logits of the two tokens, the second's share."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    with torch.no_grad():
        return [model(torch.tensor([tokenizer(a + b)["input_ids"]])).logits[0, -1, ids].softmax(-1)[1].item()
                for a, b in pairs]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("classifier"), "qwen2", num_labels=3,
                           auto_class=AutoModelForSequenceClassification,
                           id2label={0: "negative", 1: "neutral", 2: "positive"})


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return reranker_dir(tmp_path_factory.mktemp("reranker"))


def _classifier_reference(path, texts) -> list[torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return [model(torch.tensor([tokenizer.encode(t)])).logits[0].softmax(-1) for t in texts]


def _assert_close(ours, expected) -> None:
    assert len(ours) == len(expected)
    torch.testing.assert_close(torch.tensor(ours), torch.stack(expected) if isinstance(expected[0], torch.Tensor)
                               else torch.tensor(expected), rtol=1e-4, atol=1e-5)


def test_a_sequence_classifier_equals_transformers(classifier):
    llm = _llm(classifier)
    assert llm.engine.spec.labels == ["negative", "neutral", "positive"]
    assert len(llm.tokenizer.encode(TEXTS[3])) > MAX_BATCHED
    expected = _classifier_reference(classifier, TEXTS)
    _assert_close(llm.classify(TEXTS), expected)
    _assert_close(llm.classify(TEXTS), expected)  # again, over the prefix cache
    stats = llm.stats()
    assert stats["prefix_cache_hit_tokens"] > 0 and stats["num_free_blocks"] == stats["num_blocks"]
    logits = llm.embed(TEXTS[:1])[0]  # the pooled vector is the labels' logits
    _assert_close([torch.tensor(logits).softmax(-1).tolist()], expected[:1])
    with pytest.raises(InvalidInputError, match="scores pairs with one label"):
        llm.score("a", "b")
    with pytest.raises(InvalidInputError, match="no LM head"):
        llm.generate(["hi"], SamplingParams(max_tokens=1))


def test_a_classifier_serves_only_as_a_pooling_model(classifier):
    with pytest.raises(InvalidInputError, match="runner") as e:
        LLM(str(classifier), max_model_len=256)
    assert "Qwen2ForSequenceClassification has no LM head: it serves scores only" in str(e.value)


@pytest.mark.parametrize("parallel", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_tp2_and_pp2_classifiers_equal_transformers(ray_cluster, classifier, parallel):
    llm = _llm(classifier, **parallel)
    try:
        _assert_close(llm.classify(TEXTS), _classifier_reference(classifier, TEXTS))
    finally:
        llm.shutdown()


@pytest.mark.parametrize("tied", [False, True])
def test_a_causal_lm_made_a_reranker_scores_with_its_yes_and_no_logits(reranker, tmp_path, tied):
    path = reranker_dir(tmp_path / "tied") if tied else reranker
    llm = _llm(path, hf_overrides=RERANKER)
    assert llm.engine.spec.labels == ["LABEL_0"]
    expected = reranker_reference(path, [(QUERY, d) for d in DOCS])
    _assert_close(llm.score(QUERY, DOCS), expected)
    _assert_close(llm.score([QUERY] * 3, DOCS), expected)  # pair by pair
    _assert_close(llm.score(DOCS, DOCS[::-1]), reranker_reference(path, list(zip(DOCS, DOCS[::-1]))))
    _assert_close([p[0] for p in llm.classify([QUERY + DOCS[0]])], expected[:1])
    with pytest.raises(InvalidInputError, match="text_2"):
        llm.score([QUERY, QUERY], DOCS)
    with pytest.raises(InvalidInputError, match="text_2"):
        llm.score(QUERY, [])


def test_a_causal_lm_classifies_with_its_tokens_logits(reranker):
    """vLLM's `no_post_processing`: each named token's LM-head logit is a label's (bge-reranker-v2-gemma's one
    token: its sigmoid; two: their softmax)."""
    tokenizer = AutoTokenizer.from_pretrained(reranker)
    model = AutoModelForCausalLM.from_pretrained(reranker, dtype=torch.float32)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["yes"]}
    with torch.no_grad():
        logits = [model(torch.tensor([tokenizer.encode(t)])).logits[0, -1] for t in TEXTS]
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    _assert_close(_llm(reranker, hf_overrides=overrides).classify(TEXTS), [x[[yes]].sigmoid() for x in logits])
    overrides["classifier_from_token"] = ["yes", "no"]
    llm = _llm(reranker, hf_overrides=overrides)
    assert llm.engine.spec.labels == ["LABEL_0", "LABEL_1"]
    _assert_close(llm.classify(TEXTS), [x[[yes, no]].softmax(-1) for x in logits])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"classifier_from_token": ["no", "yes"], "method": "from_3_way"}, "method 'from_3_way'"),
    ({"classifier_from_token": ["no"], "method": "from_2_way_softmax"}, "takes two classifier_from_token"),
    ({"classifier_from_token": ["no", "maybe"]}, r"\['maybe'\] are not tokens"),
])
def test_a_reranker_the_checkpoint_cannot_make_is_refused(reranker, overrides, message):
    with pytest.raises(InvalidInputError, match=message) as e:
        _llm(reranker, hf_overrides={"architectures": ["Qwen3ForSequenceClassification"], **overrides})
    assert e.value.param == "hf_overrides"


def test_an_embedding_model_scores_by_cosine(qwen3_embedding):
    tokenizer = AutoTokenizer.from_pretrained(qwen3_embedding)
    model = AutoModel.from_pretrained(qwen3_embedding, dtype=torch.float32)
    with torch.no_grad():
        vectors = {t: model(torch.tensor([tokenizer.encode(t)])).last_hidden_state[0, -1] for t in [QUERY, *DOCS]}
    cosine = torch.nn.functional.cosine_similarity
    llm = _llm(qwen3_embedding)
    _assert_close(llm.score(QUERY, DOCS), [cosine(vectors[QUERY], vectors[d], dim=0).item() for d in DOCS])
    _assert_close(llm.score(DOCS, DOCS[::-1]), [cosine(vectors[a], vectors[b], dim=0).item()
                                                for a, b in zip(DOCS, DOCS[::-1])])
    with pytest.raises(InvalidInputError, match="is not a classifier"):
        llm.classify(TEXTS)
