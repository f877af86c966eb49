"""OpenAI's Conversations API: its request bodies (the handler, store and routes: deployments/http/conversations/)."""
