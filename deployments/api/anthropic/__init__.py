"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens): its request and reply bodies (the
adapter over the chat route and its routes: deployments/http/anthropic/)."""
