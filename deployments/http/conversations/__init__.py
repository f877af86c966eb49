"""OpenAI's Conversations API on the ingress: conversations and their items in the object store, and the routes."""
