"""An app's API keys and their bounds, published in Ray's internal KV, where Serve's proxies read them
(proxy_admission.py): a key as its digest, never itself. Each replica that serves an app's HTTP publishes its
app's entry on start and again every HEARTBEAT_S; an entry not renewed for EXPIRES_S (its app deleted) is
ignored, and a redeployed app's entry replaces the old one.
"""

import json
import logging
import threading
import time
from collections.abc import Collection

from ray.experimental import internal_kv

NAMESPACE = "rayllm_key_bounds"
HEARTBEAT_S = 10.0
EXPIRES_S = 3 * HEARTBEAT_S
logger = logging.getLogger(__name__)


def keep_published(app_name: str, digests: Collection[str], max_in_flight: int, max_waiting: int) -> None:
    """Publishes `app_name`'s keys (none: its entry removed) and a key's bounds in the whole app now, then renews
    them every HEARTBEAT_S from a daemon thread for as long as this process lives."""
    publish(app_name, digests, max_in_flight, max_waiting)
    if not digests:
        return

    def renew():
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                publish(app_name, digests, max_in_flight, max_waiting)
            except Exception:  # the GCS unreachable for a while: the next beat tries again
                logger.exception("could not renew app %s's published API keys", app_name)

    threading.Thread(target=renew, name="publish-api-keys", daemon=True).start()


def publish(app_name: str, digests: Collection[str], max_in_flight: int, max_waiting: int) -> None:
    if not digests:
        internal_kv._internal_kv_del(app_name, namespace=NAMESPACE)
        return
    entry = {"digests": sorted(digests), "max_in_flight": max_in_flight, "max_waiting": max_waiting,
             "published_at": time.time()}
    internal_kv._internal_kv_put(app_name, json.dumps(entry), namespace=NAMESPACE)


def read() -> dict[str, tuple[int, int]]:
    """Every live app's keys, each key's digest with its bounds (in flight, waiting), the largest where apps
    share a key."""
    bounds: dict[str, tuple[int, int]] = {}
    for app_name in internal_kv._internal_kv_list("", namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(app_name, namespace=NAMESPACE)
        entry = json.loads(value) if value is not None else None  # None: removed since listed
        if entry is None or time.time() - entry["published_at"] > EXPIRES_S:
            continue
        for digest in entry["digests"]:
            in_flight, waiting = bounds.get(digest, (0, 0))
            bounds[digest] = (max(in_flight, entry["max_in_flight"]), max(waiting, entry["max_waiting"]))
    return bounds
