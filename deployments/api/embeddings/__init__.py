"""OpenAI's Embeddings API (/v1/embeddings) and vLLM's /pooling: their request bodies (the handler on the replica:
deployments/replica/handlers/; the routes: deployments/http/routes/embeddings.py, /pooling's with the scoring
routes)."""
