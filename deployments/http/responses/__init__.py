"""OpenAI's Responses API on the ingress: the adapter over the chat route, stored responses, background runs and
their streams, and the routes."""
