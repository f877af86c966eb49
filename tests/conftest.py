import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

if not torch.cuda.is_available():  # Triton kernels run in its interpreter on CPU (set before triton is imported)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from testing.helpers import free_port
from testing.model_factory import build_model_dir, write_sentence_transformers_modules

# Qwen3 with a head_dim that differs from hidden/heads, as real Qwen3 checkpoints have
SHAPES = {
    "qwen2": {},
    "qwen3": {"head_dim": 32},
    "llama": {"tie_word_embeddings": True},
}


@pytest.fixture(scope="session", params=list(SHAPES))
def any_model(request, tmp_path_factory):
    """Each architecture's tiny checkpoint in turn."""
    return build_model_dir(tmp_path_factory.mktemp(request.param), request.param, **SHAPES[request.param])


@pytest.fixture(scope="session")
def harmony_vocab(tmp_path_factory) -> Path:
    """A directory holding o200k_base.tiktoken, named by TIKTOKEN_ENCODINGS_BASE for this process's harmony."""
    from runtime.text.harmony_chat import harmony_encoding
    from testing.harmony_vocab import write_o200k_base

    directory = tmp_path_factory.mktemp("tiktoken")
    write_o200k_base(directory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(directory))
        harmony_encoding.cache_clear()
        yield directory
    harmony_encoding.cache_clear()


@pytest.fixture(scope="session")
def qwen2_model(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("qwen2_main"), "qwen2")


@pytest.fixture(scope="session")
def qwen3_embedding(tmp_path_factory):
    """A tiny random Qwen3-Embedding: the base model's checkpoint (`Qwen3Model`) and its sentence-transformers
    modules (last-token pooling, normalised)."""
    path = build_model_dir(tmp_path_factory.mktemp("qwen3_embedding"), "qwen3", auto_class=AutoModel,
                           **SHAPES["qwen3"])
    write_sentence_transformers_modules(path, "pooling_mode_lasttoken", normalize=True)
    return path


MODEL_ID = "qwen/qwen2.5-0.5b-instruct"


class Server:
    """A running Serve app on a tiny model, with helpers to reach its replicas' stats."""

    def __init__(self, base_url: str, model_dir, engine_kwargs: dict, storage: Path):
        self.base_url = base_url
        self.model_dir = model_dir
        self.engine_kwargs = engine_kwargs
        self.storage = storage  # the app's file:// storage_uri's directory

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"

    def engine_stats(self, model_id: str = MODEL_ID) -> dict:
        from ray import serve

        from deployments.app_config import replica_name

        return serve.get_deployment_handle(replica_name(model_id), app_name="default").stats.remote().result()


class S3Server:
    """An S3-compatible HTTP server (moto's server mode) that a test can take down and bring back."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._make = lambda: ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server = self._make()
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def start(self) -> None:  # moto keeps its buckets in memory across a restart
        self._server = self._make()
        self._server.start()


@pytest.fixture(scope="session")
def s3_server():
    """Started before Ray, so the batch manager and replicas inherit the endpoint and test credentials."""
    import os

    server = S3Server()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": server.url})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_endpoint(s3_server) -> str:
    return s3_server.url


# Serve's Python proxy lets go of a client that stops reading and answers for a lost replica
# (deployments/http/proxy/), as README's operations section configures it; 20 s: no test's client stalls a write
# for that long
PROXY_ENV = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "deployments.http.proxy:proxy_middlewares",
             "RAYLLM_STREAM_STALL_S": "20"}


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint):
    import ray

    os.environ.update(PROXY_ENV)  # before Ray starts: its processes (Serve's proxy among them) inherit it
    ray.init(address="local", num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def server(ray_cluster, tmp_path_factory):
    """`serve.run` of the real app, serving a tiny Qwen2 model under the seed documents' model name."""
    from ray import serve

    from deployments import build_openai_app

    model_dir = build_model_dir(tmp_path_factory.mktemp("served"), "qwen2")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    storage = tmp_path_factory.mktemp("storage")
    serve.run(build_openai_app(app_args(model_dir, f"file://{storage}")), name="default", route_prefix="/")
    yield Server(f"http://127.0.0.1:{port}", model_dir, ENGINE_KWARGS, storage)
    serve.shutdown()


@contextmanager
def another_app(server, name: str, args: dict) -> Iterator[str]:
    """`serve.run` a second app beside the shared one, at /{name}; yields its base URL, deletes it after."""
    from ray import serve

    from deployments import build_openai_app

    serve.run(build_openai_app(args), name=name, route_prefix=f"/{name}")
    try:
        yield f"{server.base_url}/{name}"
    finally:
        serve.delete(name)


@pytest.fixture(scope="module")
def client(server):
    """The `openai` SDK pointed at the shared server."""
    import openai  # imported here: the engine's tests run where the SDK is not installed (a GPU machine)

    return openai.Client(base_url=server.openai_url, api_key="None")


@pytest.fixture(scope="module")
def embedder(server, qwen3_embedding, tmp_path_factory):
    """The `openai` SDK pointed at an app beside the shared one serving the tiny Qwen3-Embedding (at /embed)."""
    import openai

    args = app_args(qwen3_embedding, f"file://{tmp_path_factory.mktemp('embed-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {**ENGINE_KWARGS, "runner": "pooling"}
    with another_app(server, "embed", args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None")


ENGINE_KWARGS = {"max_model_len": 512, "kv_cache_bytes": 64 << 20}


def app_args(model_dir, storage_uri: str) -> dict:
    """The test app's config: the tiny model as the seed documents' model, small batch limits."""
    return {
        "llm_configs": [{
            "model_loading_config": {"model_id": MODEL_ID, "model_source": str(model_dir)},
            "engine_kwargs": ENGINE_KWARGS,
            "reasoning_parser": "qwen3",
            "tool_call_parser": "qwen25",
        }],
        "storage_uri": storage_uri,
        # one ingress replica (the product's default is two): every app a test starts costs a process less
        "ingress_deployment_config": {"num_replicas": 1},
        "start_batch_manager": False,  # most test apps run no batch: their manager starts on a first call
        "max_file_lines": 6000,
        "max_batch_line_bytes": 4096,
    }
