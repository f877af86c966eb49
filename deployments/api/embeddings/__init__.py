"""OpenAI's Embeddings API (/v1/embeddings) and vLLM's /pooling: their request bodies, the handler on the replica
and the /v1/embeddings route (/pooling's is with the scoring routes, `deployments.api.scores.routes`)."""
