"""POST /score, /rerank, /classify and /pooling at vLLM's paths (/v1/score, /v1/rerank and Cohere's /v2/rerank
too): one replica call (`ModelClient.pooling`) serves them all."""

from fastapi import APIRouter, Request

from deployments.api.embeddings.protocol import PoolingRequest
from deployments.api.scores.protocol import ClassifyRequest, RerankRequest, ScoreRequest
from deployments.http.front import OpenAIFront
from deployments.http.routing import Front, json_body

router = APIRouter()


def _route(body_type: type):
    async def pooling_route(request: Request, front: OpenAIFront = Front):
        body, model, owner = await front.generation(request, body_type)
        return await model.pooling(body, owner=owner)

    return pooling_route


PATHS = {ScoreRequest: ("/score", "/v1/score"), RerankRequest: ("/rerank", "/v1/rerank", "/v2/rerank"),
         ClassifyRequest: ("/classify",), PoolingRequest: ("/pooling",)}

for body_type, paths in PATHS.items():
    for path in paths:
        router.add_api_route(path, _route(body_type), methods=["POST"], openapi_extra=json_body(body_type),
                             name=path.strip("/").replace("/", "_"))
