"""API keys: `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route but /health, when
keys are configured.

Files and batches belong to the key that made them (recorded as a digest, never the key), so one key
cannot see another's.
"""

import hashlib
import hmac
from collections.abc import Mapping

from fastapi import Request

from deployments.errors import OpenAIError


class ApiKeys:
    def __init__(self, keys: list[str]):
        self._digests = {key_digest(k) for k in keys}

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def digests(self) -> frozenset[str]:
        return frozenset(self._digests)

    def owner(self, request: Request) -> str | None:
        """The caller's owner id (None when auth is off); raises a 401 for a missing or wrong key."""
        if not self._digests:
            return None
        owner = self.known_owner(request.headers)
        if owner is None:
            raise OpenAIError(401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                              code="invalid_api_key")
        return owner

    def known_owner(self, headers: Mapping[str, str]) -> str | None:
        """The owner id of the key these headers carry; None for no key or one not configured."""
        key = sent_key(headers)
        digest = key_digest(key) if key else None
        if digest is None or not any(hmac.compare_digest(digest, d) for d in self._digests):
            return None
        return digest[:32]


def sent_key(headers: Mapping[str, str]) -> str:
    """The key a request carries, as `Authorization: Bearer` or `x-api-key` ("" for none)."""
    scheme, _, key = headers.get("authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "").strip()


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
