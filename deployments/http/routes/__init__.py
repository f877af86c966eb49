"""Each API's HTTP routes on the ingress: parse the body into its protocol model, route it to a model's replica,
answer in JSON or as server-sent events."""
