"""The contracts both processes import: one folder per API with its request bodies (protocol.py), and what
several APIs share (the request base, sampling fields, tool schemas, reply pieces, ids, list pages, strict JSON).
The ingress parses bodies into these models (deployments/http/); the replica serves them (deployments/replica/)."""
