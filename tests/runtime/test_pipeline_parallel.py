"""Pipeline parallelism over gloo on CPU: the decoder's layers split into stages (each a tensor-parallel group),
micro-batches passed between them; PP=2 gives PP=1's greedy tokens (dense, MoE, sliding-window and hybrid
families), PP=2 x TP=2 gives TP=1's, with chunked prefill and prefix hits."""

import pytest

from runtime import LLM, InvalidInputError, SamplingParams
from runtime.distributed import PipelineStage
from runtime.worker.pipeline import split_microbatches
from runtime.worker.rank_workers import bundles_by_node
from runtime.worker.step import StepInputs
from testing.model_factory import build_model_dir

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SHARED = list(range(40, 120))  # a prefix of five blocks that half the prompts share
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(4)] + [SHARED + [i, i + 1] for i in range(8)] + \
          [list(range(10 + i, 150 + i)) for i in range(4)]
# 64-token steps: the long prompts prefill in chunks
KWARGS = {"max_model_len": 256, "max_num_batched_tokens": 64}


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _assert_same_twice(llm: LLM, expected: list[list[int]]) -> None:
    """The same tokens on a cold cache, then again over the prefixes the first run cached (a hybrid model,
    whose linear-attention layers keep a state per sequence, caches none)."""
    assert _tokens(llm) == expected
    again = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == expected
    if llm.engine.block_manager.enable_prefix_caching:
        assert all(o.num_cached_tokens >= len(SHARED) for o in again[4:12])


@pytest.fixture(scope="module")
def family_model(request, tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp(request.param), request.param, num_layers=4)


FAMILIES = ["qwen2", "qwen2_moe", "gemma2", *(pytest.param(f, marks=pytest.mark.reliability)
                                              for f in ("qwen3_next", "llama4", "deepseek_v3", "gpt_oss"))]


@pytest.mark.parametrize("family_model", FAMILIES, indirect=True)
def test_pp2_matches_pp1(ray_cluster, family_model):
    expected = _tokens(LLM(str(family_model), **KWARGS))
    llm = LLM(str(family_model), **KWARGS, pipeline_parallel_size=2)
    try:
        assert llm.engine.runner.model.model.stage_layers == range(0, 2)
        _assert_same_twice(llm, expected)
        assert llm.engine.healthy()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family_model, expert_parallel", [
    ("qwen2", False), pytest.param("qwen2_moe", True, marks=pytest.mark.reliability)], indirect=["family_model"])
def test_pp2_tp2_matches_tp1(ray_cluster, family_model, expert_parallel):
    """Two stages of two tensor-parallel ranks each; an MoE model's experts spread whole over each stage's ranks."""
    expected = _tokens(LLM(str(family_model), **KWARGS))
    llm = LLM(str(family_model), **KWARGS, pipeline_parallel_size=2, tensor_parallel_size=2,
              enable_expert_parallel=expert_parallel)
    try:
        _assert_same_twice(llm, expected)
    finally:
        llm.shutdown()


def test_uneven_stages_take_new_weights_sleep_and_wake_up(ray_cluster, tmp_path):
    """`pp_layer_partition` 1,3: rank 0 holds the embedding, layer 0 and the LM head; the other stage layers 1-3
    and the final norm. New weights, sleep and wake up reach both stages, each loading its own layers."""
    model = build_model_dir(tmp_path / "base", "qwen2", num_layers=4)
    trained = build_model_dir(tmp_path / "trained", "qwen2", num_layers=4, seed=1)
    expected = _tokens(LLM(str(trained), **KWARGS))
    llm = LLM(str(model), **KWARGS, pipeline_parallel_size=2, pp_layer_partition="1,3")
    try:
        stage0 = llm.engine.runner.model
        assert stage0.model.stage_layers == range(0, 1) and stage0.model.norm is None
        assert {name.split(".")[2] for name, _ in stage0.named_parameters() if ".layers." in name} == {"0"}
        assert _tokens(llm) != expected
        llm.update_weights(str(trained))
        assert _tokens(llm) == expected
        llm.sleep()
        llm.wake_up()
        assert _tokens(llm) == expected and llm.engine.healthy()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kwargs, param", [
    ({"pipeline_parallel_size": 3}, "pipeline_parallel_size"),  # 2 layers
    ({"pipeline_parallel_size": 2, "pp_layer_partition": [1, 2]}, "pp_layer_partition"),
    ({"pipeline_parallel_size": 2, "pp_layer_partition": "2"}, "pp_layer_partition"),
    ({"pipeline_parallel_size": 2, "pp_layer_partition": "a,b"}, "pp_layer_partition"),
    ({"pipeline_parallel_size": 2, "async_scheduling": True}, "async_scheduling"),
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
])
def test_impossible_pipelines_are_refused_at_start(qwen2_model, kwargs, param):
    with pytest.raises(InvalidInputError) as e:
        LLM(str(qwen2_model), **kwargs)
    assert e.value.param == param


def test_stages_split_layers_evenly_with_the_remainder_last():
    assert [list(PipelineStage(i, 3).layers(8)) for i in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert list(PipelineStage(1, 2, (1, 3)).layers(4)) == [1, 2, 3]


def test_microbatches_are_contiguous_sequences_of_about_equal_tokens():
    lens = [1, 1, 1, 1, 30, 2, 20]  # four decodes, then prefill chunks
    rows = sum(lens)
    inputs = StepInputs(list(range(rows)), list(range(rows)), lens, [n + 5 for n in lens],
                        [[i] for i in range(len(lens))], 4, [], [], lora_slots=list(range(len(lens))))
    parts = split_microbatches(inputs, 2)
    assert [p.query_lens for p in parts] == [[1, 1, 1, 1, 30], [2, 20]]
    assert [p.num_decodes for p in parts] == [4, 0]
    assert parts[0].input_ids + parts[1].input_ids == inputs.input_ids
    assert parts[1].block_tables == [[5], [6]] and parts[1].lora_slots == [5, 6]
    assert [p.query_lens for p in split_microbatches(inputs, 4)] == [[1, 1, 1, 1, 30], [2], [20]]
    assert len(split_microbatches(inputs, 1)) == 1


def test_ranks_follow_their_bundles_nodes():
    """Rank 0 keeps the replica's bundle; the ranks after it fill its node first, then node by node."""
    assert bundles_by_node({0: "b", 1: "a", 2: "b", 3: "a"}) == [0, 2, 1, 3]
    assert bundles_by_node({0: "a", 1: "a", 2: "a", 3: "a"}) == [0, 1, 2, 3]
