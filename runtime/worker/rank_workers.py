"""A replica's ranks 1..N-1 (tensor- and pipeline-parallel) as Ray actors, one per bundle of a placement group.

Inside a Serve replica the group is the replica's own (reserved through Serve's
placement-group options, bundle 0 holding the replica, which is rank 0); an
offline `LLM` creates one (STRICT_PACK; PACK with pipeline stages, which may
span nodes). Each worker builds its shard, joins the torch.distributed groups,
then loops on the steps rank 0 broadcasts: no Ray call per step. Building and
stepping happen in one call, so on one thread (see `async_engine` for why that
matters on CPU).
"""

import uuid

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime.config import EngineConfig
from runtime.models.spec import ModelSpec
from runtime.worker.placement import check_placement

WORKER_PREFIX = "rank-worker-"


@ray.remote(max_concurrency=2)  # `ping` answers while `serve` runs
class RankWorker:
    def serve(self, config: EngineConfig, spec: ModelSpec, eos_token_ids: set[int], rank: int, address: str) -> None:
        from runtime.worker.model_runner import ModelRunner

        ModelRunner(config, spec, eos_token_ids, rank, address).serve_rank0()

    def ping(self) -> bool:
        return True


def bundle(config: EngineConfig) -> dict:
    return {"GPU": 1, "CPU": 1} if config.device == "cuda" else {"CPU": 1}


def placement_strategy(pipeline_parallel_size: int) -> str:
    """How a replica's bundles are placed by default: on one node (STRICT_PACK), or, with pipeline stages, as few
    nodes as hold them (PACK), so a stage may take a node of its own when one node cannot hold the replica."""
    return "PACK" if pipeline_parallel_size > 1 else "STRICT_PACK"


def bundles_by_node(nodes: dict[int, str]) -> list[int]:
    """Each rank's bundle, from each bundle's node: rank 0 keeps bundle 0 (the replica's), the next ranks take
    the bundles on its node, then node by node, so a pipeline stage's tensor-parallel ranks (consecutive ranks)
    share a node wherever the placement allows."""
    first = nodes[0]
    return [0, *sorted((i for i in nodes if i != 0), key=lambda i: (nodes[i] != first, nodes[i], i))]


class RankWorkers:
    def __init__(self, config: EngineConfig, spec: ModelSpec, eos_token_ids: set[int], address: str):
        if not ray.is_initialized():
            ray.init()
        group = get_current_placement_group()
        self._own_group = None
        if group is None:
            bundles, strategy = [bundle(config)] * config.world_size, placement_strategy(config.pipeline_parallel_size)
            check_placement(bundles, strategy, f"tensor_parallel_size {config.tensor_parallel_size} x "
                                               f"pipeline_parallel_size {config.pipeline_parallel_size}")
            group = self._own_group = placement_group(bundles, strategy=strategy)
            ray.get(group.ready(), timeout=120)
        resources = {"num_gpus": 1, "num_cpus": 0} if config.device == "cuda" else {"num_cpus": 1}
        tag = uuid.uuid4().hex[:8]
        bundles = bundles_by_node(ray.util.placement_group_table(group)["bundles_to_node_id"])
        self.workers = [
            RankWorker.options(
                name=f"{WORKER_PREFIX}{tag}-rank{rank}",  # named, so operators (and tests) can find them
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
                **resources,
            ).remote()
            for rank, index in enumerate(bundles[1:], start=1)
        ]
        self._loops = [w.serve.remote(config, spec, eos_token_ids, rank, address)
                       for rank, w in enumerate(self.workers, start=1)]

    def alive(self, timeout_s: float = 5.0) -> bool:
        try:
            ray.get([w.ping.remote() for w in self.workers], timeout=timeout_s)
        except Exception:  # dead, unreachable or stuck: the replica is not healthy
            return False
        ready, _ = ray.wait(self._loops, timeout=0, num_returns=len(self._loops))
        return not ready  # a loop that returned means its worker left the group

    def shutdown(self, wait: bool = True) -> None:
        if wait:
            try:
                ray.get(self._loops, timeout=30)
            except Exception:  # a worker that died mid-step has nothing left to finish
                pass
        for worker in self.workers:
            ray.kill(worker)
        if self._own_group is not None:
            remove_placement_group(self._own_group)
