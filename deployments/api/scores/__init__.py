"""vLLM's scoring routes (/score, /rerank with Jina's and Cohere's /v2 paths, /classify) for classifiers and
embedding models: their request bodies (the handler on the replica: deployments/replica/handlers/; the routes:
deployments/http/routes/)."""
