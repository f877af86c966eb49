"""Anthropic's Messages API on the ingress: the adapter over the chat route and its routes."""
