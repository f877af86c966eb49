"""What each API key keeps in the object store, against its quota.

An owner's usage (objects, bytes) is measured by listing its keys, at most every `refresh_s` seconds per owner,
plus what this process added since: counting an owner's thousands of objects on every request would cost
one listing page per thousand. Several processes write (the ingress replicas, the batch manager), so a quota
holds within what the others wrote since this one last listed.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployments.errors import OpenAIError


@dataclass(frozen=True)
class Quota:
    objects: int
    bytes: int


class OwnerUsage:
    def __init__(self, measure: Callable[[str | None], tuple[int, int]], refresh_s: float = 10.0):
        self.measure = measure  # an owner's (objects, bytes), listed from the store
        self.refresh_s = refresh_s
        self._known: dict[str | None, tuple[float, int, int]] = {}  # owner -> (listed at, objects, bytes)
        self._lock = threading.Lock()

    def current(self, owner: str | None) -> tuple[int, int]:
        with self._lock:
            listed = self._known.get(owner)
        if listed is None or time.monotonic() - listed[0] > self.refresh_s:
            objects, size = self.measure(owner)
            listed = (time.monotonic(), objects, size)
            with self._lock:
                self._known[owner] = listed
        return listed[1], listed[2]

    def add(self, owner: str | None, objects: int, size: int) -> None:
        with self._lock:
            if owner in self._known:
                at, known_objects, known_size = self._known[owner]
                self._known[owner] = (at, known_objects + objects, known_size + size)

    def room(self, owner: str | None, quota: Quota, what: str, param: str) -> int:
        """The bytes this owner may still add; a 400 naming `param` when it may add no object at all."""
        objects, size = self.current(owner)
        if objects >= quota.objects:
            raise OpenAIError(400, f"{param}: this API key keeps {objects} {what}, its quota is {quota.objects}; "
                                   f"delete some first", param, "quota_exceeded")
        if size >= quota.bytes:
            raise OpenAIError(400, f"{param}: this API key's {what} take {size} bytes, its quota is {quota.bytes}; "
                                   f"delete some first", param, "quota_exceeded")
        return quota.bytes - size
