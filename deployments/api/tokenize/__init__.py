"""vLLM's /tokenize and /detokenize: their request bodies (the handler on the replica:
deployments/replica/handlers/; the routes: deployments/http/routes/)."""
