"""The app's HTTP ingress: the OpenAI routes in front of one replica deployment per model (two where a model's
prefill is disaggregated)."""

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.app_config import AppConfig
from deployments.disaggregated import model_clients
from deployments.http.app import build_app
from deployments.http.front import OpenAIFront
from runtime.engine.startup_heap import freeze_startup_heap

# requests a replica that serves HTTP holds at once: well past any one key's bounds (key_admission.py), so a key's
# waiting requests wait in it, where they are counted, and not in Serve's queue in front of other keys
HTTP_MAX_ONGOING = 1000


# Replicas and resources: the app config's ingress_deployment_config (builder.py)
@serve.deployment(max_ongoing_requests=HTTP_MAX_ONGOING)
@serve.ingress()
class OpenAIIngress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle],
                 prefill_replicas: dict[str, DeploymentHandle] | None = None):
        """`prefill_replicas`: the models disaggregated, their prefill deployments (deployments/disaggregated.py)."""
        clients = model_clients(replicas, prefill_replicas or {})
        self.front = OpenAIFront.for_app(config, clients, serve.get_replica_context().app_name)
        freeze_startup_heap()

    def __serve_build_asgi_app__(self):
        return build_app(self.front)

    async def __del__(self):
        """Serve stopping this replica, once its requests are done: its background responses finish first."""
        await self.front.responses.background.drain()
