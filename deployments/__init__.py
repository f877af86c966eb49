"""Everything Ray Serve and HTTP: the app builder, the OpenAI ingress, the model replicas."""

from deployments.builder import build_openai_app

__all__ = ["build_openai_app"]
