"""The replica's side of each API: a handler turns its parsed request into engine calls and the engine's outputs
into the API's reply (the request bodies: deployments/api/<api>/protocol.py)."""
