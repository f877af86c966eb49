"""The engine lifecycle's admin routes on a two-replica app: each reaches every replica; only the admin key opens
them; new weights from disk give both replicas a fresh engine's tokens on them."""

import asyncio

import pytest
import requests
from ray import serve

from deployments.api.completions.protocol import CompletionRequest
from deployments.app_config import replica_name
from deployments.broadcast import on_every_replica
from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir
from tests.conftest import MODEL_ID, another_app, app_args

ADMIN_KEY = "admin-key-0123456789"


@pytest.fixture(scope="module")
def admin_app(server, tmp_path_factory):
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('admin-storage')}")
    args["llm_configs"][0]["deployment_config"] = {"num_replicas": 2}
    args.update(admin_api_key=ADMIN_KEY, api_key="user-key")
    with another_app(server, "admin", args) as url:
        yield url


def _admin(url: str, route: str, body: dict | None = None, key: str = ADMIN_KEY, method: str = "post"):
    return requests.request(method, f"{url}/{route}", json=body, headers={"Authorization": f"Bearer {key}"},
                            timeout=120)


def _replica_texts(prompt: list[int]) -> list[str]:
    """Each replica's greedy completion of `prompt`, asked of every replica at once."""
    handle = serve.get_deployment_handle(replica_name(MODEL_ID), app_name="admin")
    req = CompletionRequest(prompt=prompt, max_tokens=8, temperature=0, ignore_eos=True)
    return [reply["choices"][0]["text"] for reply in asyncio.run(on_every_replica(handle, "completions", req))]


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

    assert _admin(admin_app, "sleep").json()["success"]
    assert _admin(admin_app, "is_sleeping", method="get").json() == {"is_sleeping": True}
    assert _admin(admin_app, "wake_up").json()["success"]
    assert _admin(admin_app, "is_sleeping", method="get").json() == {"is_sleeping": False}
    assert _replica_texts(prompt) == after
    assert _admin(admin_app, "pause", {"model": "gpt-17"}).status_code == 404
