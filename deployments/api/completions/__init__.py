"""OpenAI's (legacy) Completions API (/v1/completions): its request body, the handler on the replica and the route."""
