"""OpenAI's Responses API (/v1/responses): its request body, tools and stream events' shapes (the adapter over
the chat route, its store and routes: deployments/http/responses/)."""
