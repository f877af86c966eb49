import pytest

from tests.model_factory import build_model_dir

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
def qwen2_model(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("qwen2_main"), "qwen2")


MODEL_ID = "qwen/qwen2.5-0.5b-instruct"


class Server:
    """A running Serve app on a tiny model, with helpers to reach its replicas' stats."""

    def __init__(self, base_url: str, model_dir, engine_kwargs: dict):
        self.base_url = base_url
        self.model_dir = model_dir
        self.engine_kwargs = engine_kwargs

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"

    def engine_stats(self, model_id: str = MODEL_ID) -> dict:
        from ray import serve

        name = "LLMServer:" + model_id.replace("/", "--")
        return serve.get_deployment_handle(name, app_name="default").stats.remote().result()


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    ray.init(num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def server(ray_cluster, tmp_path_factory):
    """`serve.run` of the real app, serving a tiny Qwen2 model under the seed documents' model name."""
    import socket

    from ray import serve

    from deployments import build_openai_app

    model_dir = build_model_dir(tmp_path_factory.mktemp("served"), "qwen2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine_kwargs = {"max_model_len": 512}
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_openai_app({
        "llm_configs": [{
            "model_loading_config": {"model_id": MODEL_ID, "model_source": str(model_dir)},
            "engine_kwargs": engine_kwargs,
        }],
        "storage_uri": f"file://{tmp_path_factory.mktemp('storage')}",
    })
    serve.run(app, name="default", route_prefix="/")
    yield Server(f"http://127.0.0.1:{port}", model_dir, engine_kwargs)
    serve.shutdown()
