"""What runs in Serve's Python proxy, around every app's routes: admission by API key before routing
(admission.py), a lost replica answered for (lost_replicas.py), and the middlewares Serve takes from
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=deployments.http.proxy:proxy_middlewares` (middlewares.py)."""

from deployments.http.proxy.middlewares import proxy_middlewares

__all__ = ["proxy_middlewares"]
