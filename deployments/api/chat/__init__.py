"""OpenAI's Chat Completions API (/v1/chat/completions): its request body, the prompt rendering, the handler
on the replica and the route."""
