"""Metrics through Ray's metrics API, so Ray's Prometheus export (and KubeRay's scraping) carries them.

Names start with `rayllm_` (Ray's exporter adds its `ray_` prefix). Serve's metric classes: a figure recorded in a
replica carries its `application`, `deployment` and `replica` labels. Each process records its own: the HTTP
side counts requests (http/metrics.py), a replica times its engine's streams and reports its gauges
(replica/metrics.py), the batch manager counts batch outcomes (`count_batch`).
"""

from ray.serve.metrics import Counter

_metrics: dict = {}


def metric(kind, name: str, description: str, tags: tuple[str, ...], **kw):
    """One metric object per process, created on first use (Ray metrics live in the process that records)."""
    if name not in _metrics:
        _metrics[name] = kind(name, description=description, tag_keys=tags, **kw)
    return _metrics[name]


def count_batch(kind: str, outcome: str) -> None:
    """`kind` is "request" (outcome completed/failed) or "batch" (outcome: its final status)."""
    metric(Counter, "rayllm_batch_events", "Batch requests and batches by outcome", ("kind", "outcome")).inc(
        1, tags={"kind": kind, "outcome": outcome})
