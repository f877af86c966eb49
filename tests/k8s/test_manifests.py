"""The KubeRay manifests validate against the RayService CRD's schema, and their serve config
against our own config validation."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from deployments.app_config import parse_app_config

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "k8s").glob("rayservice*.yaml"))
QWEN_MANIFESTS = [m for m in MANIFESTS if m.name != "rayservice-multinode.yaml"]  # configs/qwen.yaml's app


@pytest.fixture(scope="module")
def schema():
    return json.loads((ROOT / "k8s/schema/rayservice-v1.openapi.json").read_text())


def test_there_is_a_gpu_a_cpu_and_a_multinode_manifest():
    assert [m.name for m in MANIFESTS] == ["rayservice-cpu.yaml", "rayservice-multinode.yaml", "rayservice.yaml"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_the_crd_schema(path, schema):
    manifest = yaml.safe_load(path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    jsonschema.validate(manifest, schema)
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    head_container = head["template"]["spec"]["containers"][0]
    assert {"containerPort": 8000, "name": "serve"} in head_container["ports"]
    for container in [head_container] + [g["template"]["spec"]["containers"][0]
                                         for g in cluster["workerGroupSpecs"]]:
        assert {"secretRef": {"name": "rayllm-secrets"}} in container["envFrom"]


def test_gpu_manifest_has_a_gpu_worker_group():
    manifest = yaml.safe_load((ROOT / "k8s/rayservice.yaml").read_text())
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_multinode_manifest_puts_a_stage_on_each_pod():
    """A replica of tensor_parallel_size x pipeline_parallel_size ranks, a GPU bundle each: a stage's ranks are one
    pod's GPUs, and the worker group's pods come in whole replicas."""
    manifest = yaml.safe_load((ROOT / "k8s/rayservice-multinode.yaml").read_text())
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    (llm,) = parse_app_config(app["args"]).llm_configs
    tp, pp = llm.engine_kwargs["tensor_parallel_size"], llm.engine_kwargs["pipeline_parallel_size"]
    assert pp == 2 and llm.ranks() == tp * pp == len(llm.placement_group_config.bundles)
    assert all(bundle["GPU"] == 1 for bundle in llm.placement_group_config.bundles)
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == tp
    assert group["minReplicas"] % pp == group["maxReplicas"] % pp == 0 and group["minReplicas"] >= pp


def test_a_broken_manifest_is_caught(schema):
    manifest = yaml.safe_load((ROOT / "k8s/rayservice.yaml").read_text())
    manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, schema)


@pytest.mark.parametrize("path", QWEN_MANIFESTS, ids=lambda p: p.name)
def test_embedded_serve_config_runs_configs_qwen_application(path):
    serve_config = yaml.safe_load(yaml.safe_load(path.read_text())["spec"]["serveConfigV2"])
    (app,) = serve_config["applications"]
    assert app["import_path"] == "deployments:build_openai_app"
    config = parse_app_config(app["args"])  # our own validation, as at `serve run`
    local = yaml.safe_load((ROOT / "configs/qwen.yaml").read_text())["applications"][0]
    assert app["import_path"] == local["import_path"] and app["route_prefix"] == local["route_prefix"]
    ours = config.llm_configs[0].model_loading_config
    theirs = parse_app_config(local["args"]).llm_configs[0].model_loading_config
    assert ours == theirs  # the same model, under the same name
    assert config.storage_uri.startswith("s3://")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"llm_configs\.0\.engine_kwargs"):
        parse_app_config({"llm_configs": [{"model_loading_config": {"model_id": "m"},
                                           "engine_kwargs": {"max_num_seqz": 4}}]})
    with pytest.raises(ValueError, match="storage_uri"):
        parse_app_config({"llm_configs": [{"model_loading_config": {"model_id": "m"}}], "storage_uri": "ftp://x"})
    for placement, message in [({"bundles": [{"CPU": 1}]}, "1 bundles for 2 ranks"),
                               ({"bundles": [{"CPU": 1}, {"memory": 1}]}, "takes a CPU or a GPU"),
                               ({"bundles": [{"CPU": 1}] * 2, "strategy": "ANYWHERE"}, "strategy")]:
        with pytest.raises(ValueError, match=rf"llm_configs\.0.*{message}"):
            parse_app_config({"llm_configs": [{"model_loading_config": {"model_id": "m"},
                                               "engine_kwargs": {"tensor_parallel_size": 2},
                                               "placement_group_config": placement}]})
    for experimental in ({"stream_batching_interval_ms": -1}, {"stream_batching_interval": 10}):
        with pytest.raises(ValueError, match=r"llm_configs\.0\.experimental_configs\.stream_batching_interval"):
            parse_app_config({"llm_configs": [{"model_loading_config": {"model_id": "m"},
                                               "experimental_configs": experimental}]})


def test_grafana_dashboard_queries_only_metrics_we_export():
    """Every series the dashboard reads (through Ray's export: `ray_` before the name) is one the app defines, ours
    (`rayllm_`) or vLLM's (`vllm_`), and it reads vLLM's where the app has them."""
    import re

    source = "".join((ROOT / f"deployments/{path}").read_text()
                     for path in ("metrics.py", "http/metrics.py", "replica/metrics.py"))
    defined = set(re.findall(r'"((?:rayllm|vllm)_[a-z0-9_]+)"', source)) | {
        f"rayllm_{name}" for name in re.findall(r'\("([a-z_]+)", "[A-Z]', source)}
    dashboard = json.loads((ROOT / "k8s/grafana-dashboard.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in expressions for m in re.findall(r"ray_((?:rayllm|vllm)_[a-z0-9_]+)", e)}
    exported = {u for u in used if u in defined or re.sub(r"_(bucket|total|count|sum)$", "", u) in defined}
    assert used and exported == used
    assert {"vllm_time_to_first_token_seconds_bucket", "vllm_num_requests_running", "vllm_kv_cache_usage_perc",
            "vllm_prefix_cache_hits_total"} <= used


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_gcs_fault_tolerance_uses_the_shipped_redis(path):
    manifest = yaml.safe_load(path.read_text())
    options = manifest["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    redis = {doc["kind"]: doc for doc in yaml.safe_load_all((ROOT / "k8s/redis.yaml").read_text())}
    service = redis["Service"]
    assert options["redisAddress"] == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    secret = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    container = redis["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == secret
    assert redis["Deployment"]["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert serve_config["proxy_location"] == "EveryNode"
    assert parse_app_config(serve_config["applications"][0]["args"]).ingress_deployment_config["num_replicas"] >= 2


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_ray_container_starts_in_serves_high_throughput_mode(path):
    cluster = yaml.safe_load(path.read_text())["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        env = {e["name"]: e["value"] for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
