"""The HTTP side: routes, body parsing, auth, middleware. The same code in both serving modes: on the ingress
deployment (which reaches each model's replicas through `clients.RemoteModel`) or on a model's replica that is
also the ingress (direct streaming)."""
