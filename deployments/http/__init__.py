"""The HTTP side: each API's routes, the Responses, Anthropic and Conversations adapters, SSE framing, body
parsing, auth, admission and middleware. The same code in both serving modes: on the ingress deployment (which
reaches each model's replicas through `clients.RemoteModel`) or on a model's replica that is also the ingress
(direct streaming, direct_server.py)."""
