"""OpenAI's Chat Completions API (/v1/chat/completions): its request body (the prompt rendering and handler on
the replica: deployments/replica/; the route: deployments/http/routes/chat.py)."""
