"""Ranks the cluster cannot hold are refused at once, naming the bundles asked for and what each node has: an
offline engine's own placement group (a 2-CPU cluster asked for PP2 x TP2), and a served model's replica (the app
refused as it is built); the fit itself under each of Ray's strategies."""

import subprocess
import sys

import pytest

from runtime import InvalidInputError
from runtime.worker.placement import fits
from tests.conftest import app_args

ONE = {"CPU": 1}


@pytest.mark.parametrize("strategy, nodes, expected", [
    ("STRICT_PACK", [{"CPU": 2}, {"CPU": 2}], False),  # four ranks on one node of two CPUs: never
    ("PACK", [{"CPU": 2}, {"CPU": 2}], True),
    ("PACK", [{"CPU": 2}, {"CPU": 1}], False),
    ("STRICT_SPREAD", [{"CPU": 8}, {"CPU": 8}, {"CPU": 8}], False),  # a node each: three nodes for four
    ("SPREAD", [{"CPU": 8}], True),
])
def test_the_fit_follows_the_strategy(strategy, nodes, expected):
    assert fits([ONE] * 4, strategy, nodes) is expected


def test_an_engine_the_cluster_cannot_place_fails_at_once(qwen2_model):
    """In a cluster of its own (2 CPUs): PP2 x TP2 is refused within 5 s, naming what it asked for and the node."""
    script = (
        "import time, ray\n"
        "from runtime import LLM, InvalidInputError\n"
        "ray.init(address='local', num_cpus=2, include_dashboard=False, logging_level='ERROR')\n"
        "start = time.monotonic()\n"
        "try:\n"
        f"    LLM({str(qwen2_model)!r}, tensor_parallel_size=2, pipeline_parallel_size=2, max_model_len=128)\n"
        "except InvalidInputError as e:\n"
        "    print(f'{time.monotonic() - start:.3f}'); print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    seconds, message = out.stdout.strip().split("\n", 1)
    assert float(seconds) < 5, out.stdout
    assert message == ("tensor_parallel_size: tensor_parallel_size 2 x pipeline_parallel_size 2: 4 bundles of "
                       "{CPU: 1} placed PACK (on as few nodes as hold them), and the cluster cannot hold them "
                       "(node 0: {CPU: 2})"), message


def test_a_served_model_the_cluster_cannot_place_is_refused_as_the_app_is_built(ray_cluster, qwen2_model, tmp_path):
    from deployments import build_openai_app

    args = app_args(qwen2_model, f"file://{tmp_path}")
    args["llm_configs"][0]["engine_kwargs"] = {"tensor_parallel_size": 16}  # the test cluster has 8 CPUs
    with pytest.raises(InvalidInputError, match=r"16 bundles of \{CPU: 1\} placed STRICT_PACK .* \(node 0: "
                                                r"\{CPU: 8\}\)"):
        build_openai_app(args)
