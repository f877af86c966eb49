"""The serving modes the README names, each started with `serve run` on the installed Ray, stream a chat through
the `openai` SDK and create and stream a message through the `anthropic` SDK: the ingress hop with Serve's Python
proxy, the ingress hop under HAProxy, and direct streaming under HAProxy (direct streaming alone runs in-process,
in test_direct_streaming.py). Each runs configs/local.yaml (on the tiny test model) in its own `serve run`, which
starts its own Ray: HAProxy is switched on by the environment Ray's processes start with."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import psutil
import pytest
import requests
import yaml

from testing.helpers import free_port, wait_until
from tests.conftest import MODEL_ID

ROOT = Path(__file__).resolve().parents[3]
SERVE = str(Path(sys.executable).parent / "serve")  # the CLI of the Ray this interpreter imports
HAPROXY = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
# The default suite runs `serve run` under HAProxy; the other two in the reliability run (.ci/run), each covered
# in the default suite without `serve run`'s own Ray: the ingress hop behind Serve's proxy by every test of the
# shared in-process app (conftest's `server`), direct streaming by test_direct_streaming.py's app (chats,
# messages, batches)
MODES = {"ingress": pytest.param(({}, False), marks=pytest.mark.reliability), "haproxy": (HAPROXY, False),
         "direct+haproxy": pytest.param((HAPROXY, True), marks=pytest.mark.reliability)}


def local_config(model_dir, storage: Path, port: int, direct: bool) -> dict:
    """configs/local.yaml on the tiny model, one core, a free port; no warm-up and no batch manager before the
    app says ready (each has tests of its own), for the suite's time."""
    config = yaml.safe_load((ROOT / "configs/local.yaml").read_text())
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    llm = args["llm_configs"][0]
    llm["model_loading_config"]["model_source"] = str(model_dir)
    llm["engine_kwargs"] = {**llm["engine_kwargs"], "max_model_len": 512, "kv_cache_bytes": 64 << 20,
                            "warm_up": False}
    llm["deployment_config"]["ray_actor_options"]["num_cpus"] = 1
    args["storage_uri"] = f"file://{storage}"
    args["direct_streaming"] = direct
    args["start_batch_manager"] = False
    return config


def assert_messages_create_and_stream(claude: anthropic.Anthropic, model: str) -> None:
    """A message and its stream through the `anthropic` SDK: the same greedy text, 8 tokens each."""
    kwargs = dict(model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                  extra_body={"temperature": 0, "ignore_eos": True})
    message = claude.messages.create(**kwargs)
    assert message.model == model and message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == message.content[0].text
    assert final.usage.output_tokens == 8 and final.stop_reason == "max_tokens"


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/v1/models", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_each_mode_starts_and_streams_a_chat_and_a_message(mode, qwen2_model, tmp_path):
    env_overrides, direct = mode
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(local_config(qwen2_model, tmp_path / "storage", port, direct)))
    env = {k: v for k, v in os.environ.items() if k not in HAPROXY and k != "RAY_ADDRESS"}
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen([SERVE, "run", str(config)], cwd=tmp_path, env={**env, **env_overrides},
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.poll() is not None or _ready(url), 240)
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        client = openai.Client(base_url=f"{url}/v1", api_key="none")
        chunks = list(client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage.completion_tokens == 8
        assert_messages_create_and_stream(anthropic.Anthropic(base_url=url, api_key="none"), MODEL_ID)
    finally:
        _kill_with_its_ray(server)
        log.close()
        _stop_orphaned_haproxy(started=psutil.Process(os.getpid()).create_time())


def _kill_with_its_ray(server: subprocess.Popen) -> None:
    """Stop `serve run` and the Ray it started (its descendants) at once: a graceful Serve shutdown waits out the
    controller's 30 s drain, which is no part of what this test checks."""
    procs = psutil.Process(server.pid).children(recursive=True)
    os.killpg(server.pid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    server.wait()
    psutil.wait_procs(procs, timeout=30)


def _stop_orphaned_haproxy(started: float) -> None:
    """Serve's HAProxy can outlive `serve run` (re-parented, in its own session) and hold its stats ports, which
    the next mode's HAProxy binds: stop this interpreter's HAProxy processes started since this test session."""
    for proc in psutil.process_iter(["exe", "create_time"]):
        if (proc.info["exe"] or "").startswith(sys.prefix) and proc.info["exe"].endswith("/haproxy") \
                and proc.info["create_time"] >= started:
            proc.kill()
