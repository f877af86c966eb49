"""What Serve's Python proxy wraps its app in (the package's `proxy_middlewares`): set
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=deployments.http.proxy:proxy_middlewares` in the environment Ray starts
with (`serve run`'s, or the Ray nodes'). Behind HAProxy (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`, the KubeRay
manifests' mode) the client's connection is the ingress replica's own, and the app's middleware
(deployments/http/app.py) does what applies there.
"""

from starlette.middleware import Middleware

from deployments.http.proxy.admission import ProxyKeyAdmission
from deployments.http.proxy.lost_replicas import LostReplicaGuard
from deployments.http.stalled_streams import StalledStreamGuard


def proxy_middlewares() -> list[Middleware]:
    """Serve wraps its app in these in order, so the last is outermost: a key past its bounds waits or is refused
    before anything else is done for it; then a stalled client is let go, whatever the guard of a lost replica
    would still write to it; a lost replica costs a retry or an error in the API's shape."""
    return [Middleware(LostReplicaGuard), Middleware(StalledStreamGuard), Middleware(ProxyKeyAdmission)]
