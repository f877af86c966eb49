"""A replica's recent time to first token and inter-token latency, which it reports to Serve's autoscaler
(`LLMServer.record_autoscaling_stats`) for the latency-target policy (deployments/autoscaling.py)."""

import math
import time
from collections import deque

WINDOW_S = 20.0  # the span of requests a replica's figures describe
_MAX_SAMPLES = 20_000  # of each kind; the oldest go first


class LatencyWindow:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._samples = {"ttft": deque(maxlen=_MAX_SAMPLES), "itl": deque(maxlen=_MAX_SAMPLES)}

    def add(self, kind: str, seconds: float) -> None:
        """A first token's wait (`ttft`) or a gap between tokens (`itl`), now (the engine's thread records)."""
        self._samples[kind].append((time.monotonic(), seconds))

    def p90s(self, oldest_wait: float | None = None) -> dict[str, float]:
        """`ttft_p90_s` and `itl_p90_s` over the window, each only where there is a figure for it. `oldest_wait`:
        how long the longest-waiting request still without its first token has waited, a floor under the TTFT
        figure, so that an overload shows before its first tokens do."""
        since = time.monotonic() - self.window_s
        figures = {}
        for kind, samples in self._samples.items():
            values = sorted(value for at, value in list(samples) if at >= since)
            if values:
                figures[f"{kind}_p90_s"] = values[math.ceil(0.9 * len(values)) - 1]  # the nearest rank
        if oldest_wait is not None:
            figures["ttft_p90_s"] = max(figures.get("ttft_p90_s", 0.0), oldest_wait)
        return figures
