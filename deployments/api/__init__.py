"""The wire formats and per-endpoint logic of each API: request bodies (parsed on the HTTP side), and the
handlers that turn a request into engine work and its outputs into reply bodies (run on the replica)."""
