"""One folder per API (chat, completions, generate, embeddings, tokenize, responses, anthropic, batches), each
with its request bodies (protocol.py, parsed on the HTTP side), its handler (turning a request into engine work
and its outputs into reply bodies, on the replica) and its routes. Beside them, what several APIs share: the
request base and sampling fields, reply pieces, ids, list pages, SSE framing and the routes' helpers."""
