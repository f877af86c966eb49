"""`deployments:build_openai_app`: the Serve application for a config's `args`."""

import math
import os

import ray
from ray import serve
from ray.serve import Application, Deployment

from deployments.app_config import AppConfig, LLMConfig, encoder_name, parse_app_config, replica_name
from deployments.http.direct_server import DirectLLMServer
from deployments.http.ingress import HTTP_MAX_ONGOING, OpenAIIngress
from deployments.prefix_router import PrefixAwareRouter
from deployments.replica.encoder_server import EncoderServer
from deployments.replica.server import LLMServer
from runtime.openmp_env import SPINCOUNT
from runtime.worker.placement import check_placement
from runtime.worker.rank_workers import placement_strategy

# How long a replica that Serve stops (a scale-down, a redeploy) goes on serving the requests it has, taking no
# new ones, before Serve kills it (its `graceful_shutdown_timeout_s`; Serve's own default, 20 s, cuts a long
# generation). What is still running then ends as a lost replica's requests do: a stream with the API's error
# event, a request that has returned nothing sent to another replica, batch lines back in their batch's queue.
DRAIN_TIMEOUT_S = 300.0
INGRESS_DRAIN_MARGIN_S = 30.0
# how often Serve asks each replica what its prefix cache holds, for the prefix-aware router (Serve's default: 10 s)
ROUTING_STATS_PERIOD_S = 1.0


def build_openai_app(args: dict) -> Application:
    """One replica deployment per model (and one of prefill replicas where it is disaggregated) behind one OpenAI
    ingress; in direct streaming, the model's replica deployment is the ingress."""
    config = parse_app_config(args)
    _check_storage_is_shared(config)
    # image encoder deployments (deployments/replica/encoder_server.py), bound into their models' replicas
    encoders = {c.model_id: _replica(c.encoder(), EncoderServer, prefix_routing=False,
                                     name=encoder_name(c.model_id)).bind(c.encoder())
                for c in config.llm_configs if c.encoder_config is not None}
    if config.direct_streaming:
        # Under HAProxy, HAProxy picks the replica for HTTP requests and Serve refuses a custom router on the
        # ingress deployment: the replica, its own ingress here, keeps Serve's default router
        return _replica(config.llm_configs[0], DirectLLMServer, prefix_routing=not _haproxy(),
                        max_ongoing=HTTP_MAX_ONGOING).bind(config, encoders.get(config.llm_configs[0].model_id))
    replicas = {c.model_id: _replica(c, LLMServer).bind(c, config.otlp_traces_endpoint, config.media_policy(),
                                                        encoders.get(c.model_id))
                for c in config.llm_configs}
    # disaggregated models' prefill replicas (deployments/disaggregated.py)
    prefill_configs = [c.prefill() for c in config.llm_configs if c.prefill_config is not None]
    prefill = {p.model_id: _replica(p, LLMServer, name=replica_name(p.model_id, prefill=True)).bind(
                   p, config.otlp_traces_endpoint, config.media_policy(), encoders.get(p.model_id))
               for p in prefill_configs}
    options = dict(config.ingress_deployment_config)
    # the ingress drains for longer than the replicas it streams from, so their streams end in the API's shape
    options.setdefault("graceful_shutdown_timeout_s", INGRESS_DRAIN_MARGIN_S + max(
        c.deployment_config.get("graceful_shutdown_timeout_s", DRAIN_TIMEOUT_S) for c in config.llm_configs))
    # no CPU reserved unless asked: like Serve's proxy, the ingress only routes; the cores go to the engines
    actor_options = {"num_cpus": 0, **options.pop("ray_actor_options", {})}
    if "max_replicas_per_node" not in options and (per_node := _spread_over_nodes(options, actor_options)):
        options["max_replicas_per_node"] = per_node
    return OpenAIIngress.options(ray_actor_options=actor_options, **options).bind(config, replicas, prefill)


def _spread_over_nodes(options: dict, actor_options: dict) -> int | None:
    """The fewest ingress replicas per node that still fits them all on the cluster's live nodes that can host
    one, so that losing a node never takes every ingress replica with it. Serve's own SPREAD placement is best
    effort: two replicas were seen sharing a node of four. None (no bound) on a single node or with no cluster
    yet; a cluster that later shrinks below the bound leaves the extra replicas pending until nodes return."""
    if not ray.is_initialized():
        return None
    wanted = options.get("autoscaling_config", {}).get("max_replicas") or options.get("num_replicas", 1)
    if not isinstance(wanted, int):  # Serve's num_replicas: "auto"
        return None
    per_node = math.ceil(wanted / max(_live_nodes(actor_options.get("resources", {})), 1))
    return per_node if per_node < wanted else None


def _live_nodes(needs: dict | None = None) -> int:
    """The cluster's live nodes that have the custom resources `needs` asks for."""
    return sum(1 for node in ray.nodes() if node["Alive"]
               and all(node["Resources"].get(name, 0) >= need for name, need in (needs or {}).items()))


def _check_storage_is_shared(config: AppConfig) -> None:
    """A file:// storage on a multi-node cluster must be declared shared: batches, files and stored responses
    are read and written by actors on any node."""
    if not config.storage_uri.startswith("file://") or config.shared_storage or not ray.is_initialized():
        return
    nodes = _live_nodes()
    if nodes > 1:
        raise ValueError(f"storage_uri {config.storage_uri} is a local directory, but the cluster has {nodes} nodes: "
                         "use an s3:// storage_uri, or set shared_storage: true if every node mounts it")


def _haproxy() -> bool:
    """Whether Serve runs HAProxy in place of its Python proxy (Ray Serve's switch, read from the environment
    of the process that builds the app, as Serve itself reads it)."""
    return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY", "0") == "1"


def _replica(config: LLMConfig, server_class: type, prefix_routing: bool = True, name: str | None = None,
             max_ongoing: int = 256) -> Deployment:
    """The model's replica deployment (or another of its deployments, by `name`: its prefill replicas, its image
    encoder), with its Serve options and resources (a GPU when wanted, a bundle per tensor-parallel rank).
    `max_ongoing`: its `max_ongoing_requests` unless the config sets one (a replica that serves HTTP itself takes
    the ingress's)."""
    options = {"name": name or replica_name(config.model_id), **config.deployment_config}
    options.setdefault("max_ongoing_requests", max_ongoing)
    options.setdefault("graceful_shutdown_timeout_s", DRAIN_TIMEOUT_S)
    if prefix_routing:
        options.setdefault("request_router_config", {"request_router_class": PrefixAwareRouter,
                                                     "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S})
    actor_options = dict(options.pop("ray_actor_options", {}))
    if "num_gpus" not in actor_options and _wants_gpu(config):
        actor_options["num_gpus"] = 1
        if config.accelerator_type:
            actor_options["accelerator_type"] = config.accelerator_type
    actor_options.setdefault("num_cpus", 1)
    actor_options["runtime_env"] = _replica_env(actor_options.get("runtime_env"))
    ranks = config.ranks()
    if config.placement_group_config is not None:  # the user's bundles, one per rank
        options["placement_group_bundles"] = config.placement_group_config.bundles
        options["placement_group_strategy"] = config.placement_group_config.strategy
    elif ranks > 1:  # one bundle per rank; the replica (rank 0) takes bundle 0, its workers the rest
        rank_bundle = {"CPU": actor_options["num_cpus"]}
        if actor_options.get("num_gpus"):
            rank_bundle["GPU"] = actor_options["num_gpus"]
        options.setdefault("placement_group_bundles", [rank_bundle] * ranks)
        options.setdefault("placement_group_strategy",
                           placement_strategy(config.engine_kwargs.get("pipeline_parallel_size", 1)))
    if "placement_group_bundles" in options and ray.is_initialized():  # else Serve waits for them forever
        kwargs = config.engine_kwargs
        check_placement(options["placement_group_bundles"], options.get("placement_group_strategy", "PACK"),
                        f"tensor_parallel_size {kwargs.get('tensor_parallel_size', 1)} x pipeline_parallel_size "
                        f"{kwargs.get('pipeline_parallel_size', 1)} of model {config.model_id}")
    return serve.deployment(server_class).options(ray_actor_options=actor_options, **options)


# Spin waits of torch's OpenMP workers between ops, in libgomp's busy-loop iterations (its default is 300,000, a
# millisecond or so). The replica shares its cores with its own asyncio and tokenizing threads, Serve's proxy and
# the batch manager; on a small machine its idle workers' spinning took as much CPU as the engine thread
# itself during a batch. 10,000 keeps single-stream decode as fast and cuts the replica's CPU for the same
# batch (figures: docs/performance.md).
_REPLICA_ENV = {"GOMP_SPINCOUNT": SPINCOUNT}


def _replica_env(runtime_env: dict | None) -> dict:
    """The replica's runtime_env: the user's, with _REPLICA_ENV's variables where it does not set them (its
    tensor-parallel workers inherit it)."""
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**_REPLICA_ENV, **runtime_env.get("env_vars", {})}
    return runtime_env


def _wants_gpu(config: LLMConfig) -> bool:
    """A GPU replica when an accelerator is named, the engine asks for cuda, or the cluster has GPUs."""
    device = config.engine_kwargs.get("device", "auto")
    if device == "cpu":
        return False
    if config.accelerator_type or device == "cuda":
        return True
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
