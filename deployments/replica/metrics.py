"""A replica's metrics: its engine's request latencies and token counts, and its gauges, under vLLM's names where
vLLM has the metric (`vllm_...` here: Ray's metric names take no colon; /metrics shows them as vLLM's `vllm:...`),
ours (`rayllm_...`) where it has not."""

import time
from dataclasses import dataclass, field

from ray.serve.metrics import Counter, Gauge, Histogram

from deployments.metrics import metric
from deployments.replica.latency_window import LatencyWindow
from runtime import RequestDelta

_LATENCY = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]


class RequestMetrics:
    """The engine's `StreamObserver` on a replica: time to first token, inter-token and end-to-end latency, prompt
    and generated tokens, finished completions by reason, under vLLM's names and `model_name` label; prompt tokens
    served from the prefix cache under ours."""

    def __init__(self, model_id: str):
        self.tags = {"model_name": model_id}
        self.window = LatencyWindow()  # recent latencies also go here, for the autoscaler
        m = ("model_name",)
        self._ttft = metric(Histogram, "vllm_time_to_first_token_seconds", "Time to first token", m,
                             boundaries=_LATENCY)
        self._itl = metric(Histogram, "vllm_inter_token_latency_seconds", "Time between tokens", m,
                            boundaries=_LATENCY)
        self._e2e = metric(Histogram, "vllm_e2e_request_latency_seconds", "Request latency in the engine", m,
                            boundaries=_LATENCY)
        self._tokens = {kind: metric(Counter, name, text, m) for kind, name, text in [
            ("prompt", "vllm_prompt_tokens", "Prompt tokens"),
            ("generation", "vllm_generation_tokens", "Generated tokens"),
            ("cached", "rayllm_cached_prompt_tokens", "Prompt tokens served from the prefix cache")]}
        self._finished = metric(Counter, "vllm_request_success", "Completions finished, by reason",
                                ("model_name", "finished_reason"))
        self._open: dict[str, _Timing] = {}

    def started(self, request_id: str) -> None:
        self._open[request_id] = _Timing()

    def delta(self, request_id: str, delta: RequestDelta) -> None:
        timing = self._open[request_id]
        now = time.perf_counter()
        tokens = sum(len(s.token_ids) for s in delta.seqs)
        if timing.generated == 0:
            self._ttft.observe(now - timing.start, tags=self.tags)
            self.window.add("ttft", now - timing.start)
        elif tokens:  # a delta may carry several steps' tokens: their mean gap
            self._itl.observe((now - timing.last) / tokens, tags=self.tags)
            self.window.add("itl", (now - timing.last) / tokens)
        timing.generated += tokens
        timing.last = now
        timing.prompt, timing.cached = delta.num_prompt_tokens, delta.num_cached_tokens
        for seq in delta.seqs:
            if seq.finish_reason is not None:
                self._finished.inc(1, tags={**self.tags, "finished_reason": seq.finish_reason})

    def oldest_wait(self) -> float | None:
        """How long the longest-waiting request still without its first token has waited; None if none waits."""
        starts = [t.start for t in list(self._open.values()) if t.generated == 0]
        return time.perf_counter() - min(starts) if starts else None

    def ended(self, request_id: str) -> None:
        timing = self._open.pop(request_id)
        self._e2e.observe(time.perf_counter() - timing.start, tags=self.tags)
        for kind, value in (("prompt", timing.prompt), ("generation", timing.generated), ("cached", timing.cached)):
            if value > 0:  # Ray's counters refuse a zero increment
                self._tokens[kind].inc(value, tags=self.tags)


@dataclass
class _Timing:
    start: float = field(default_factory=time.perf_counter)
    last: float = 0.0
    generated: int = 0
    prompt: int = 0
    cached: int = 0


# the figures of features that are off by default (speculative decoding, the KV offload tier), from the engine's
# stats when they are on: gauge name -> (stat, description)
_FEATURES = {
    "spec_decode_num_drafts": ("spec_num_drafts", "Verifications of draft tokens, since the engine started"),
    "spec_decode_num_draft_tokens": ("spec_num_draft_tokens", "Draft tokens proposed, since the engine started"),
    "spec_decode_num_accepted_tokens": ("spec_num_accepted_tokens", "Draft tokens accepted, since the engine started"),
    "spec_decode_acceptance_rate": ("spec_acceptance_rate", "Draft tokens accepted / proposed"),
    "spec_decode_mean_accepted_length": ("spec_mean_accepted_length", "Tokens a verification yields, on average"),
    "kv_offload_bytes": ("kv_offload_bytes", "Bytes of KV blocks held in the offload tier"),
    "kv_offload_capacity_bytes": ("kv_offload_capacity_bytes", "The offload tier's capacity in bytes"),
    "kv_offload_hit_tokens": ("kv_offload_hit_tokens", "Prompt tokens loaded back from the offload tier, since the "
                                                       "engine started"),
}
# counters of the engine's running totals: vLLM's name -> (stat, description)
_TOTALS = {
    "vllm_prefix_cache_queries": ("prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache"),
    "vllm_prefix_cache_hits": ("prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache"),
    "vllm_num_preemptions": ("num_preemptions", "Sequences preempted"),
}


class EngineGauges:
    """From the engine's stats, once a second: running and waiting sequences and KV-cache usage (vLLM's gauges),
    prefix-cache lookups and hits and preemptions (vLLM's counters), speculative decoding's and the KV offload
    tier's figures (ours)."""

    def __init__(self, model_id: str):
        self.tags = {"model_name": model_id}
        m = ("model_name",)
        self._gauges = {name: metric(Gauge, name, text, m) for name, text in [
            ("vllm_num_requests_running", "Sequences running"), ("vllm_num_requests_waiting", "Sequences waiting"),
            ("vllm_kv_cache_usage_perc", "Fraction of KV-cache blocks in use"),
            *((f"rayllm_{name}", text) for name, (_, text) in _FEATURES.items()),
        ]}
        self._counters = {name: metric(Counter, name, text, m) for name, (_, text) in _TOTALS.items()}
        self._counted = dict.fromkeys(_TOTALS, 0)

    def update(self, stats: dict) -> None:
        values = [("vllm_num_requests_running", stats["num_running"]),
                  ("vllm_num_requests_waiting", stats["num_waiting"]),
                  ("vllm_kv_cache_usage_perc", 1 - stats["num_free_blocks"] / stats["num_blocks"])]
        values += [(f"rayllm_{name}", stats[key]) for name, (key, _) in _FEATURES.items() if key in stats]
        for name, value in values:
            self._gauges[name].set(value, tags=self.tags)
        for name, (key, _) in _TOTALS.items():
            if stats[key] > self._counted[name]:  # Ray's counters refuse a zero increment
                self._counters[name].inc(stats[key] - self._counted[name], tags=self.tags)
            self._counted[name] = stats[key]
