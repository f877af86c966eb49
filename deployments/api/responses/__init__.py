"""OpenAI's Responses API (/v1/responses) over the chat route, with responses stored in the app's object store."""
