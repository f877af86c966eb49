"""Whether a replica's ranks can be placed, asked before waiting on Ray for them: a placement group the cluster can
never hold waits forever (Serve) or until a timeout that says only "not ready" (an offline engine). Bundles are
checked against each live node's total resources (what is in use now may be given back; what is not there never
will be), under the group's strategy; a cluster that autoscales may add nodes, so there the wait goes on."""

import logging

import ray

from runtime.errors import InvalidInputError

logger = logging.getLogger(__name__)

_STRATEGIES = {"STRICT_PACK": "all on one node", "PACK": "on as few nodes as hold them",
               "SPREAD": "on as many nodes as may be", "STRICT_SPREAD": "each on a node of its own"}


def check_placement(bundles: list[dict[str, float]], strategy: str, what: str) -> None:
    """Raise InvalidInputError (naming `what` asked for) when no node set of the cluster can hold `bundles`
    under `strategy` and no autoscaler can add nodes; log that the group waits for nodes where one can."""
    nodes = [{k: v for k, v in node["Resources"].items() if not k.startswith("node:")}
             for node in ray.nodes() if node["Alive"]]
    if fits(bundles, strategy, nodes):
        return
    asked = f"{what}: {len(bundles)} bundles of {_resources(bundles[0])} placed {strategy} ({_STRATEGIES[strategy]})"
    if ray._private.state.state.get_max_resources_from_cluster_config():
        logger.warning("%s; the cluster cannot hold them now and autoscales: waiting for its nodes", asked)
        return
    held = "; ".join(f"node {i}: {_resources(node)}" for i, node in enumerate(nodes)) or "no live node"
    raise InvalidInputError(what.split()[0], f"{asked}, and the cluster cannot hold them ({held})")


def fits(bundles: list[dict[str, float]], strategy: str, nodes: list[dict[str, float]]) -> bool:
    """Whether `nodes` (each its total resources) hold `bundles` under `strategy`: first fit, largest first."""
    if strategy == "STRICT_PACK":
        return any(_holds(node, _sum(bundles)) for node in nodes)
    free = [dict(node) for node in nodes]
    used: set[int] = set()
    for bundle in sorted(bundles, key=lambda b: -sum(b.values())):
        options = [i for i, node in enumerate(free) if _holds(node, bundle)
                   and (strategy != "STRICT_SPREAD" or i not in used)]
        if not options:
            return False
        i = options[0]
        used.add(i)
        for name, amount in bundle.items():
            free[i][name] -= amount
    return True


def _holds(node: dict[str, float], bundle: dict[str, float]) -> bool:
    return all(node.get(name, 0) >= amount for name, amount in bundle.items())


def _sum(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0) + amount
    return total


def _resources(resources: dict[str, float]) -> str:
    shown = {name: amount for name, amount in resources.items() if name in ("CPU", "GPU") or name.startswith("accel")}
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(shown.items())) + "}"
