"""vLLM's /tokenize and /detokenize: their request bodies, the handler on the replica and the routes."""
