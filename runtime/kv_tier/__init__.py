"""KV blocks kept beyond the pool, by their prefix hashes: the offload tier's index (index.py) and its host
memory on each rank (host_storage.py), and the tier a cluster's engines share through Ray (shared.py)."""
