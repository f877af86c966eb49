"""Checkpoints in GPTQ's and AWQ's layouts (`quant_method: gptq | awq`, as AutoGPTQ, GPTQModel, AutoAWQ and
AutoRound write them), written by AutoRound: the weights stay quantized in our engine's memory, and its greedy
tokens are transformers' on the weights as AutoRound's own code decodes them (testing.auto_round_checkpoints)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime import LLM, InvalidInputError
from runtime.layers.quantization.experts import QuantizedExperts
from testing.auto_round_checkpoints import decoded_reference_model, write_auto_round
from testing.model_factory import build_model_dir
from tests.runtime.test_quantized_checkpoints import (
    SHAPE,
    assert_reference_tokens,
    greedy_tokens,
    quantized_prompts,
)

# (bits, group size, symmetric): groups with zero points, symmetric groups, 8 bits by channel
SCHEMES = {"w4 g128 asym": (4, 128, False), "w4 g32": (4, 32, True), "w8 channel": (8, -1, True)}
LABELS = {"w4 g128 asym": "w4a16 asym", "w4 g32": "w4a16", "w8 channel": "w8a16"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The scheme's checkpoints, {quant_method: path} (AWQ's only for 4 bits with zero points: its layout's)."""
    base = build_model_dir(tmp_path_factory.mktemp("base"), **SHAPE)
    paths = {}

    def export(scheme: str) -> dict:
        if scheme not in paths:
            bits, group, sym = SCHEMES[scheme]
            formats = ("auto_gptq", "auto_awq") if scheme == "w4 g128 asym" else ("auto_gptq",)
            paths[scheme] = write_auto_round(base, tmp_path_factory.mktemp(scheme.replace(" ", "-")), bits, group,
                                             sym, formats)
        return paths[scheme]

    return export


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_tokens_are_transformers_on_autorounds_decoding(exported, scheme, tmp_path):
    paths = exported(scheme)
    reference = decoded_reference_model(paths["gptq"], tmp_path / "decoded")
    for method, path in paths.items():
        llm = LLM(str(path), dtype="float32", max_model_len=256)
        assert llm.engine.spec.quantization.label == f"{method} ({LABELS[scheme]})"
        prompts = quantized_prompts(llm.tokenizer)
        assert_reference_tokens(reference, prompts, greedy_tokens(llm, prompts))
        projections = [m for m in llm.engine.runner.model.modules() if getattr(m, "quantized", None) is not None]
        assert len(projections) == 2 * 4 and all(m.weight is None for m in projections)
        resident = sum(m.quantized.nbytes() for m in projections)
        bf16 = sum(2 * m.quantized.out_features * m.quantized.in_features for m in projections)
        assert resident / bf16 < (0.35 if SCHEMES[scheme][0] == 4 else 0.6)


def test_awq_tp2_matches_tp1(ray_cluster, exported):
    """AWQ's words along the rows and its zero points, split by input group on the row-parallel projections."""
    path = exported("w4 g128 asym")["awq"]
    tp1 = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(tp1.tokenizer)[:8]
    expected = greedy_tokens(tp1, prompts)
    tp2 = LLM(str(path), dtype="float32", max_model_len=256, tensor_parallel_size=2)
    try:
        assert greedy_tokens(tp2, prompts) == expected
    finally:
        tp2.shutdown()


def test_gptq_moe_experts_stay_quantized(tmp_path_factory):
    """AutoRound quantizes each expert as a projection; they load into the quantized expert loop."""
    base = build_model_dir(tmp_path_factory.mktemp("moe"), **{**SHAPE, "arch": "qwen3_moe"}, moe_intermediate_size=256)
    path = write_auto_round(base, tmp_path_factory.mktemp("moe-gptq"), 4, 128, False, ("auto_gptq",))["gptq"]
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    prompts = quantized_prompts(llm.tokenizer)
    assert_reference_tokens(decoded_reference_model(path, tmp_path_factory.mktemp("moe-decoded")), prompts,
                            greedy_tokens(llm, prompts))
    experts = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantizedExperts)]
    assert len(experts) == 2 and all(len(m.gate_up) == m.num_experts for m in experts)


def test_what_is_not_built_fails_at_start_naming_it(exported, tmp_path):
    source = exported("w4 g128 asym")["gptq"]
    shutil.copytree(source, tmp_path / "act-order")
    tensors = load_file(tmp_path / "act-order" / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()  # act-order: the inputs in another order than their groups'
    save_file(tensors, tmp_path / "act-order" / "model.safetensors")
    with pytest.raises(InvalidInputError, match="GPTQ act-order checkpoints"):
        LLM(str(tmp_path / "act-order"), dtype="float32", max_model_len=256)
    awq = exported("w4 g128 asym")["awq"]
    for method, change, message in [("awq", {"version": "gemv"}, "awq checkpoints with .*'version': 'gemv'"),
                                    ("gptq", {"bits": 3}, "gptq checkpoints with .*'bits': 3"),
                                    ("gptq", {"checkpoint_format": "marlin"}, "'checkpoint_format': 'marlin'")]:
        changed = tmp_path / f"{method}-{next(iter(change.values()))}"
        shutil.copytree(awq if method == "awq" else source, changed)
        config = json.loads((changed / "config.json").read_text())
        config["quantization_config"].update(change)
        (changed / "config.json").write_text(json.dumps(config))
        with pytest.raises(InvalidInputError, match=message):
            LLM(str(changed), dtype="float32", max_model_len=256)
    assert torch.equal(load_file(source / "model.safetensors")[name], torch.arange(512) // 128)
