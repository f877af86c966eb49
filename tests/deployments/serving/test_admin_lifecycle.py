"""The admin routes on a two-replica app: each reaches every replica; only the admin key opens them; a LoRA adapter
loaded through vLLM's route (kept in the app's storage) gives the offline engine's tokens with it on both replicas,
named as `<model>:<name>` or, as vLLM's clients name it, by its bare name, and unloaded is a 404; new weights from
disk, or broadcast by a trainer process, give both replicas a fresh engine's tokens on them."""

import asyncio
import subprocess
import sys

import openai
import pytest
import requests
from ray import serve

from deployments.api.completions.protocol import CompletionRequest
from deployments.app_config import replica_name
from deployments.broadcast import on_every_replica
from runtime import LLM, LoRARequest, SamplingParams
from runtime.distributed import free_address
from testing.lora_adapters import make_adapter
from testing.model_factory import build_model_dir
from testing.weight_trainer import checkpoint_update
from tests.conftest import MODEL_ID, another_app, app_args

ADMIN_KEY = "admin-key-0123456789"


@pytest.fixture(scope="module")
def admin_app(server, tmp_path_factory):
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('admin-storage')}")
    args["llm_configs"][0]["deployment_config"] = {"num_replicas": 2}
    args["llm_configs"][0]["lora_config"] = {"max_lora_rank": 16}  # adapters kept in the app's storage
    args.update(admin_api_key=ADMIN_KEY, api_key="user-key")
    with another_app(server, "admin", args) as url:
        yield url


def _admin(url: str, route: str, body: dict | None = None, key: str = ADMIN_KEY, method: str = "post"):
    return requests.request(method, f"{url}/{route}", json=body, headers={"Authorization": f"Bearer {key}"},
                            timeout=120)


def _replica_texts(prompt: list[int], model: str = MODEL_ID) -> list[str]:
    """Each replica's greedy completion of `prompt`, asked of every replica at once."""
    handle = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="admin")
    req = CompletionRequest(model=model, prompt=prompt, max_tokens=8, temperature=0, ignore_eos=True)
    return [reply["choices"][0]["text"] for reply in asyncio.run(on_every_replica(handle, "completions", req))]


def test_lora_adapters_load_and_unload_on_every_replica(server, admin_app, tmp_path):
    make_adapter(server.model_dir, tmp_path / "fresh", 8, 16, ["q_proj", "v_proj", "down_proj"], False, seed=3)
    make_adapter(server.model_dir, tmp_path / "too-big", 32, 16, ["q_proj"], False, seed=4)
    load = {"lora_name": "fresh", "lora_path": str(tmp_path / "fresh")}
    loaded = _admin(admin_app, "v1/load_lora_adapter", load)
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'fresh' added successfully."
    refused = {"already loaded": (load, "lora_name"), "a bad name": ({**load, "lora_name": "../x"}, "lora_name"),
               "no adapter there": ({**load, "lora_name": "other", "lora_path": str(tmp_path)}, "lora_path"),
               "a rank over max_lora_rank": ({"lora_name": "big", "lora_path": str(tmp_path / "too-big")},
                                             "lora_path")}
    for why, (body, param) in refused.items():
        response = _admin(admin_app, "v1/load_lora_adapter", body)
        assert (response.status_code, response.json()["error"]["param"]) == (400, param), why
    models = requests.get(f"{admin_app}/v1/models", headers={"Authorization": "Bearer user-key"}).json()
    assert [m["id"] for m in models["data"]] == [MODEL_ID, f"{MODEL_ID}:fresh"]  # the refused one was removed

    prompt = [5, 6, 7, 8] * 6
    llm = LLM(str(server.model_dir), enable_lora=True, max_model_len=512)
    expected = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                            lora_request=LoRARequest("fresh", str(tmp_path / "fresh")))[0].outputs[0].text
    assert _replica_texts(prompt, f"{MODEL_ID}:fresh") == [expected] * 2 != _replica_texts(prompt)
    sdk = openai.Client(base_url=f"{admin_app}/v1", api_key="user-key", max_retries=0)
    bare = sdk.completions.create(model="fresh", prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})  # vLLM's flow: the adapter by its lora_name
    assert (bare.model, bare.choices[0].text) == ("fresh", expected)
    unloaded = _admin(admin_app, "v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert unloaded.status_code == 200 and unloaded.text == "Success: LoRA adapter 'fresh' removed successfully."
    assert _admin(admin_app, "v1/unload_lora_adapter", {"lora_name": "fresh"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="fresh", prompt=prompt, max_tokens=8)
    gone = requests.post(f"{admin_app}/v1/completions", json={"model": f"{MODEL_ID}:fresh", "prompt": "hi"},
                         headers={"Authorization": "Bearer user-key"})
    assert gone.status_code == 404


def test_admin_routes_pause_update_and_sleep_every_replica(server, admin_app, tmp_path):
    assert _admin(server.base_url, "pause").status_code == 404  # the shared app has no admin key: no such route
    assert _admin(admin_app, "pause", key="user-key").status_code == 401  # an API key is not the admin key
    assert _admin(admin_app, "is_paused", method="get").json() == {"is_paused": False}
    assert _admin(admin_app, "pause", {"mode": "keep"}).json() == {"success": True, "replicas": 2}
    assert _admin(admin_app, "is_paused", method="get").json() == {"is_paused": True}
    assert _admin(admin_app, "pause", {"mode": "later"}).status_code == 400
    assert _admin(admin_app, "resume").json()["success"]
    assert _admin(admin_app, "is_paused", method="get").json() == {"is_paused": False}

    prompt = [5, 6, 7, 8] * 6
    before = _replica_texts(prompt)
    trained = build_model_dir(tmp_path / "trained", "qwen2", seed=1)
    bad = _admin(admin_app, "update_weights_from_disk", {"model_path": str(tmp_path)})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model_path"
    assert _admin(admin_app, "update_weights_from_disk", {"model_path": str(trained), "model": MODEL_ID}).json() \
        == {"success": True, "replicas": 2}
    fresh = LLM(str(trained), max_model_len=512).generate([prompt], SamplingParams(temperature=0, max_tokens=8,
                                                                                   ignore_eos=True))
    after = _replica_texts(prompt)
    assert after == [fresh[0].outputs[0].text] * 2 != before
    assert _admin(admin_app, "reset_prefix_cache").json()["success"]

    # the first weights back, from a trainer process that broadcasts them to both replicas (world: it and them)
    body, _ = checkpoint_update(server.model_dir)
    address, port = free_address().removeprefix("tcp://").rsplit(":", 1)
    trainer = subprocess.Popen([sys.executable, "-m", "testing.weight_trainer", str(server.model_dir), address, port,
                                "3"])
    try:
        group = {"master_address": address, "master_port": int(port), "rank_offset": 1, "world_size": 3}
        assert _admin(admin_app, "init_weights_update_group", group).json() == {"success": True, "replicas": 2}
        assert _admin(admin_app, "update_weights_from_distributed", body).json()["success"]
        assert trainer.wait(timeout=60) == 0
    finally:
        trainer.kill()
    assert _replica_texts(prompt) == before

    assert _admin(admin_app, "sleep").json()["success"]
    assert _admin(admin_app, "is_sleeping", method="get").json() == {"is_sleeping": True}
    assert _admin(admin_app, "wake_up").json()["success"]
    assert _admin(admin_app, "is_sleeping", method="get").json() == {"is_sleeping": False}
    assert _replica_texts(prompt) == after  # woken from the last checkpoint loaded from disk
    assert _admin(admin_app, "pause", {"model": "gpt-17"}).status_code == 404
