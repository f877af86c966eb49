"""OpenAI's Conversations API."""
