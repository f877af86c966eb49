"""The request bodies of /score, /rerank and /classify, as vLLM takes them (text inputs)."""

from pydantic import Field, field_validator, model_validator

from deployments.api.embeddings.protocol import PooledInputs, PoolingRequest
from deployments.api.request_model import Priority, RequestModel
from deployments.api.sampling_fields import MAX_SEQUENCES

# the other names vLLM takes for /score's two sides
_SCORE_ALIASES = {"queries": "text_1", "data_1": "text_1", "documents": "text_2", "items": "text_2",
                  "data_2": "text_2"}


def _bounded(texts: list[str]) -> list[str]:
    if len(texts) > MAX_SEQUENCES:
        raise ValueError(f"{len(texts)} texts, over the limit of {MAX_SEQUENCES} per request")
    return texts


class ScoringFields(RequestModel):
    model: str | None = None
    user: str | None = None  # accepted, unused
    priority: int = Priority
    # a classifier's score is its label's probability; false: the logit itself
    use_activation: bool | None = None
    # each query's and each document's text cut to that many tokens first (0: not cut)
    max_tokens_per_query: int = Field(0, ge=0)
    max_tokens_per_doc: int = Field(0, ge=0)


class ScoreRequest(ScoringFields):
    """`text_1` scored against each of `text_2` (or the two lists pair by pair); vLLM's other names for them
    (queries and documents or items, data_1 and data_2) are taken too."""

    text_1: str | list[str]
    text_2: str | list[str]

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            for alias, field in _SCORE_ALIASES.items():
                if alias in data and field not in data:
                    data[field] = data.pop(alias)
        return data

    @field_validator("text_1", "text_2")
    @classmethod
    def _listed(cls, v):
        return _bounded([v] if isinstance(v, str) else v)


class RerankRequest(ScoringFields):
    """Jina's and Cohere's rerank body, as vLLM takes it: the documents ordered by relevance to the query."""

    query: str
    documents: list[str]
    top_n: int = Field(0, ge=0)  # the best `top_n` only; 0: every document
    return_documents: bool = True  # each result carries its document's text (Cohere's v1 name)

    @field_validator("documents", mode="before")
    @classmethod
    def _texts(cls, v):
        """Cohere's older document objects ({"text": ...}) count as their text."""
        if isinstance(v, list):
            return [d["text"] if isinstance(d, dict) and isinstance(d.get("text"), str) else d for d in v]
        return v

    @field_validator("documents")
    @classmethod
    def _few_enough(cls, v):
        return _bounded(v)


class ClassifyRequest(PooledInputs):
    """Label probabilities for each input (the logits when `use_activation` is false)."""

    use_activation: bool | None = None


# the pooling routes beyond /v1/embeddings, which one replica call serves (`ModelClient.pooling`)
PoolingCall = PoolingRequest | ScoreRequest | RerankRequest | ClassifyRequest
