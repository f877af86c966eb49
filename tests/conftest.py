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
