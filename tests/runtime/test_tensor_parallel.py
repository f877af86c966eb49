"""Tensor parallelism over gloo on CPU: TP=2 gives TP=1's greedy tokens, offline and served (and PP=2 served:
its offline tests are test_pipeline_parallel.py)."""

import subprocess
import sys

import openai
import pytest
import ray
import requests

from runtime import LLM, InvalidInputError, SamplingParams
from runtime.distributed import free_address
from runtime.layers.mlp import _CPU_MLP_ROWS
from runtime.worker.rank_workers import WORKER_PREFIX
from testing.model_factory import build_model_dir
from testing.weight_trainer import checkpoint_update
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# the last three make one prefill step longer than the CPU MLP's row block (blocks reduced across ranks at once)
PROMPTS = [[5, 6, 7, 8], list(range(3, 70)), [9] * 20, *(list(range(10 + i, 210 + i)) for i in range(3))]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("kv1"), "qwen2", num_kv_heads=1)


def test_tp2_matches_tp1(ray_cluster, any_model):
    assert sum(map(len, PROMPTS)) > _CPU_MLP_ROWS
    expected = _tokens(LLM(str(any_model), max_model_len=256))
    llm = LLM(str(any_model), max_model_len=256, tensor_parallel_size=2)
    try:
        assert _tokens(llm) == expected
        assert llm.engine.healthy()
    finally:
        llm.shutdown()


def test_tp2_with_one_kv_head_replicates_it(ray_cluster, one_kv_head_model):
    expected = _tokens(LLM(str(one_kv_head_model), max_model_len=256))
    llm = LLM(str(one_kv_head_model), max_model_len=256, tensor_parallel_size=2)
    try:
        assert llm.engine.runner.model.model.layers[0].self_attn.num_kv_heads == 1
        assert _tokens(llm) == expected
    finally:
        llm.shutdown()


def test_tp2_takes_new_weights_and_wakes_up_on_every_rank(ray_cluster, qwen2_model, tmp_path):
    """The lifecycle (runtime.engine.lifecycle) reaches the workers: each rank loads its shard of the new
    checkpoint, sleeps and wakes up with rank 0, and receives a trainer's broadcast weights."""
    trained = build_model_dir(tmp_path / "trained", "qwen2", seed=1)
    expected = _tokens(LLM(str(trained), max_model_len=256))
    llm = LLM(str(qwen2_model), max_model_len=256, tensor_parallel_size=2)
    try:
        original = _tokens(llm)
        assert original != expected
        llm.update_weights(str(trained))
        assert _tokens(llm) == expected
        llm.sleep()
        llm.wake_up()
        assert _tokens(llm) == expected and llm.engine.healthy()
        # the original weights back, broadcast by a trainer process to both ranks, each taking its shard
        body, _ = checkpoint_update(qwen2_model)
        address, port = free_address().removeprefix("tcp://").rsplit(":", 1)
        trainer = subprocess.Popen([sys.executable, "-m", "testing.weight_trainer", str(qwen2_model), address, port,
                                    "3"])
        try:
            llm.engine.init_weights_update_group(address, int(port), 1, 3)
            llm.engine.update_weights_from_distributed(body["names"], body["dtypes"], body["shapes"])
            assert trainer.wait(timeout=60) == 0
        finally:
            trainer.kill()
        assert _tokens(llm) == original
    finally:
        llm.shutdown()


def test_impossible_split_is_refused_at_start(qwen2_model):
    with pytest.raises(InvalidInputError) as e:
        LLM(str(qwen2_model), tensor_parallel_size=3)  # 4 heads, 2 KV heads
    assert e.value.param == "tensor_parallel_size" and "4 attention heads" in str(e.value)


@pytest.fixture(scope="module")
def tp_app(server, tmp_path_factory):
    """A second app whose replica is a TP=2 engine (its worker in the replica's placement group)."""
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('tp')}")
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "tensor_parallel_size": 2}
    args["llm_configs"][0]["deployment_config"] = {"health_check_period_s": 1, "health_check_timeout_s": 10}
    with another_app(server, "tp", args) as url:
        yield f"{url}/v1"


# the default suite serves TP=2 in the worker-kill test below (tp_app) and offline in the tests above
PARALLEL = {"pp2": {"pipeline_parallel_size": 2},
            "tp2": pytest.param({"tensor_parallel_size": 2}, marks=pytest.mark.reliability)}


@pytest.mark.parametrize("parallel", PARALLEL.values(), ids=PARALLEL.keys())
def test_served_parallel_replica_matches_offline_one_rank(server, qwen2_model, tmp_path, parallel):
    """With the replica's bundles given as Ray Serve LLM's `placement_group_config` (the TP worker's test below
    takes the default, a bundle per rank in STRICT_PACK)."""
    placement = {"bundles": [{"CPU": 1}, {"CPU": 1}], "strategy": "SPREAD"}
    _served_matches_offline(server, qwen2_model, tmp_path, parallel, placement)
    assert any(g["strategy"] == "SPREAD" and list(g["bundles"].values()) == [{"CPU": 1.0}] * 2
               for g in ray.util.placement_group_table().values())


@pytest.mark.reliability  # the default suite has it offline (test_tp2_with_one_kv_head_replicates_it) and served TP2
def test_served_tp2_with_one_kv_head(server, one_kv_head_model, tmp_path):
    _served_matches_offline(server, one_kv_head_model, tmp_path, {"tensor_parallel_size": 2})


def _served_matches_offline(server, model_dir, storage, parallel: dict, placement: dict | None = None):
    """The model through `serve.run` on several ranks (`parallel`'s sizes) against the offline engine on one."""
    args = app_args(model_dir, f"file://{storage}")
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, **parallel}
    args["llm_configs"][0]["placement_group_config"] = placement
    with another_app(server, "tp-parity", args) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        messages = [{"role": "user", "content": "List 3 countries and their capitals."}]
        served = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=24)
        offline = LLM(str(model_dir), **ENGINE_KWARGS).chat(messages, SamplingParams(temperature=0, max_tokens=24))
        assert served.choices[0].message.content == offline[0].outputs[0].text


def test_killed_tp_worker_fails_requests_fast_then_serve_recovers(tp_app):
    from testing.helpers import wait_until

    (worker,) = _workers()
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "long story"}], "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    stream = requests.post(f"{tp_app}/chat/completions", json=body, stream=True, timeout=60)
    lines = stream.iter_lines()
    next(lines)
    ray.kill(ray.get_actor(worker["name"], namespace=worker["namespace"]))  # the worker dies mid-stream
    rest = b"\n".join(lines)  # the stream ends with an error event; it does not hang
    assert b'"error"' in rest and rest.rstrip().endswith(b"data: [DONE]")
    client = openai.Client(base_url=tp_app, api_key="None", max_retries=0)

    def answers():
        try:
            reply = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4, extra_body={"ignore_eos": True})
        except openai.APIError:
            return False
        return reply.usage.completion_tokens == 4

    wait_until(answers, timeout=180, every=1)  # Serve's health check replaced the replica
    (replacement,) = _workers()
    assert replacement["name"] != worker["name"]


def _workers() -> list[dict]:
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(WORKER_PREFIX)]
