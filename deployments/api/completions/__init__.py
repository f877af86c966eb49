"""OpenAI's (legacy) Completions API (/v1/completions): its request body (the handler on the replica:
deployments/replica/handlers/; the route: deployments/http/routes/)."""
