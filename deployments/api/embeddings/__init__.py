"""OpenAI's Embeddings API (/v1/embeddings): its request body, the handler on the replica and the route."""
