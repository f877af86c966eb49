"""SGLang's native /generate: its request body and sampling_params (the handler on the replica:
deployments/replica/handlers/; the route: deployments/http/routes/)."""
