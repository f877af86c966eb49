"""A replica's metrics: its engine's request latencies and token counts, and its gauges."""

import time
from dataclasses import dataclass, field

from ray.util.metrics import Counter, Gauge, Histogram

from deployments.metrics import metric
from runtime import RequestDelta

_LATENCY = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]


class RequestMetrics:
    """The engine's `StreamObserver` on a replica: time to first token, inter-token and end-to-end latency,
    tokens by kind, per model."""

    def __init__(self, model_id: str):
        self.tags = {"model": model_id}
        m = ("model",)
        self._ttft = metric(Histogram, "rayllm_time_to_first_token_seconds", "Time to first token", m,
                             boundaries=_LATENCY)
        self._itl = metric(Histogram, "rayllm_inter_token_latency_seconds", "Time between tokens", m,
                            boundaries=_LATENCY)
        self._e2e = metric(Histogram, "rayllm_e2e_latency_seconds", "Request latency in the engine", m,
                            boundaries=_LATENCY)
        self._tokens = metric(Counter, "rayllm_tokens", "Tokens by kind: prompt, generation, cached",
                               ("model", "kind"))
        self._open: dict[str, _Timing] = {}

    def started(self, request_id: str) -> None:
        self._open[request_id] = _Timing()

    def delta(self, request_id: str, delta: RequestDelta) -> None:
        timing = self._open[request_id]
        now = time.perf_counter()
        tokens = sum(len(s.token_ids) for s in delta.seqs)
        if timing.generated == 0:
            self._ttft.observe(now - timing.start, tags=self.tags)
        elif tokens:  # a delta may carry several steps' tokens: their mean gap
            self._itl.observe((now - timing.last) / tokens, tags=self.tags)
        timing.generated += tokens
        timing.last = now
        timing.prompt, timing.cached = delta.num_prompt_tokens, delta.num_cached_tokens

    def ended(self, request_id: str) -> None:
        timing = self._open.pop(request_id)
        self._e2e.observe(time.perf_counter() - timing.start, tags=self.tags)
        for kind, value in (("prompt", timing.prompt), ("generation", timing.generated), ("cached", timing.cached)):
            if value > 0:  # Ray's counters refuse a zero increment
                self._tokens.inc(value, tags={**self.tags, "kind": kind})


@dataclass
class _Timing:
    start: float = field(default_factory=time.perf_counter)
    last: float = 0.0
    generated: int = 0
    prompt: int = 0
    cached: int = 0


# speculative decoding's figures, from the engine's stats when it speculates: gauge name -> (stat, description)
_SPECULATION = {
    "spec_decode_num_drafts": ("spec_num_drafts", "Verifications of draft tokens, since the engine started"),
    "spec_decode_num_draft_tokens": ("spec_num_draft_tokens", "Draft tokens proposed, since the engine started"),
    "spec_decode_num_accepted_tokens": ("spec_num_accepted_tokens", "Draft tokens accepted, since the engine started"),
    "spec_decode_acceptance_rate": ("spec_acceptance_rate", "Draft tokens accepted / proposed"),
    "spec_decode_mean_accepted_length": ("spec_mean_accepted_length", "Tokens a verification yields, on average"),
}


class EngineGauges:
    """Running and waiting sequences, KV-cache usage, prefix-cache hit rate and speculative decoding's figures,
    from the engine's stats."""

    def __init__(self, model_id: str):
        self.tags = {"model": model_id}
        self._gauges = {name: metric(Gauge, f"rayllm_{name}", text, ("model",)) for name, text in [
            ("running_requests", "Sequences running"), ("waiting_requests", "Sequences waiting"),
            ("kv_cache_usage", "Fraction of KV-cache blocks in use"),
            ("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / looked up"),
            *((name, text) for name, (_, text) in _SPECULATION.items()),
        ]}

    def update(self, stats: dict) -> None:
        used = 1 - stats["num_free_blocks"] / stats["num_blocks"]
        queried = stats["prefix_cache_queried_tokens"]
        values = [("running_requests", stats["num_running"]), ("waiting_requests", stats["num_waiting"]),
                  ("kv_cache_usage", used),
                  ("prefix_cache_hit_rate", stats["prefix_cache_hit_tokens"] / queried if queried else 0)]
        values += [(name, stats[key]) for name, (key, _) in _SPECULATION.items() if key in stats]
        for name, value in values:
            self._gauges[name].set(value, tags=self.tags)
