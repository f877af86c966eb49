"""API keys: `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route but /health, when
keys are configured.

Files and batches belong to the key that made them (recorded as a digest, never the key), so one key
cannot see another's.
"""

import hashlib
import hmac

from fastapi import Request

from deployments.errors import OpenAIError


class ApiKeys:
    def __init__(self, keys: list[str]):
        self._digests = {_digest(k) for k in keys}

    def owner(self, request: Request) -> str | None:
        """The caller's owner id (None when auth is off); raises a 401 for a missing or wrong key."""
        if not self._digests:
            return None
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        digest = _digest(key) if key else None
        if digest is None or not any(hmac.compare_digest(digest, d) for d in self._digests):
            raise OpenAIError(401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                              code="invalid_api_key")
        return digest[:32]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
