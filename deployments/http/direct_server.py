"""Direct streaming: a model's replica that is also the app's HTTP ingress.

Requests and their streamed chunks go from Serve's proxy (or HAProxy) straight
to the replica running the engine, skipping the ingress deployment's extra hop
and process. One model per app; across several replicas the proxy spreads
HTTP requests by load, not by prompt prefix (batch requests, which arrive
through handles, still route by prefix).
"""

from ray import serve

from deployments.app_config import AppConfig
from deployments.http.app import build_app
from deployments.http.front import OpenAIFront
from deployments.replica.server import LLMServer


@serve.ingress()
class DirectLLMServer(LLMServer):
    def __init__(self, config: AppConfig, encoder=None):
        super().__init__(config.llm_configs[0], config.otlp_traces_endpoint, config.media_policy(), encoder)
        # the replica is its own ModelClient
        self.front = OpenAIFront.for_app(config, {self.model_id: self}, serve.get_replica_context().app_name)

    def __serve_build_asgi_app__(self):
        return build_app(self.front)
