"""The HTTP side's metrics: requests counted by route and status, and /metrics's text for runs without a
Prometheus (this node's export from Ray, filtered to our metric families, vLLM's under vLLM's spelling)."""

import ray
import requests
from ray.serve.metrics import Counter

from deployments.metrics import metric


class RequestCounter:
    """ASGI middleware counting HTTP requests by route and status when the response starts.

    Plain ASGI on purpose: Starlette's `@app.middleware("http")` relays every
    streamed chunk through an extra task and memory stream.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                route = getattr(scope.get("route"), "path", "unmatched")
                metric(Counter, "rayllm_requests", "HTTP requests by route and status", ("route", "status")).inc(
                    1, tags={"route": route, "status": str(message["status"])})
            await send(message)

        await self.app(scope, receive, counting_send)



def node_metrics_text() -> str:
    """This node's Prometheus export from Ray, keeping only our metric families; those under vLLM's names with
    vLLM's own spelling (Ray's `ray_vllm_x` is `vllm:x`), so dashboards made for vLLM read them."""
    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    text = requests.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=5).text
    return "".join(line.replace("ray_vllm_", "vllm:") + "\n" for line in text.splitlines()
                   if "rayllm_" in line or "ray_vllm_" in line)
