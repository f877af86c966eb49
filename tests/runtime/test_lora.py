"""LoRA adapters in the engine: greedy tokens equal transformers + PEFT on the same random base and adapter, for one
adapter and for one batch mixing three adapters and the base model; slots replaced least-recently-used under a
stream of five adapters with two slots; prefix-cache blocks never shared across adapters; bad adapters refused;
TP=2 gives TP=1's tokens."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime import LLM, InvalidInputError, LoRARequest, SamplingParams
from testing.lora_adapters import ALL, ATTENTION, make_adapter

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 60)), [11] * 24]
# name -> (rank, alpha, target modules, rsLoRA)
ADAPTERS = {"all8": (8, 16, ALL, False), "attn4": (4, 8, ATTENTION, False), "mlp16rs": (16, 4, ["gate_proj",
            "up_proj", "down_proj"], True), "qv2": (2, 2, ["q_proj", "v_proj"], False), "down8": (8, 32, ["down_proj"],
                                                                                               False)}


@pytest.fixture(scope="module")
def adapters(qwen2_model, tmp_path_factory):
    """Each adapter's LoRARequest and the PEFT model it was saved from."""
    made = {}
    for seed, (name, (rank, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        path = tmp_path_factory.mktemp(f"lora-{name}")
        made[name] = (LoRARequest(name, str(path)), make_adapter(qwen2_model, path, rank, alpha, targets, rslora,
                                                                 seed))
    return made


def reference(model, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=GREEDY.max_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def lora_llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), dtype="float32", max_model_len=256, enable_lora=True, **kwargs)


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_one_adapter_matches_peft(qwen2_model, adapters):
    request, peft_model = adapters["all8"]
    llm = lora_llm(qwen2_model)
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=request)) == [reference(peft_model, p) for p in PROMPTS]
    base = AutoModelForCausalLM.from_pretrained(qwen2_model, dtype=torch.float32)
    assert tokens(llm.generate(PROMPTS[:1], GREEDY)) == [reference(base, PROMPTS[0])]  # no adapter: the base


def test_one_batch_mixing_three_adapters_and_the_base(qwen2_model, adapters):
    names = ["all8", "attn4", "mlp16rs", None]
    llm = lora_llm(qwen2_model, max_loras=3)
    loras = [adapters[n][0] if n else None for n in names for _ in PROMPTS]
    prompts = PROMPTS * len(names)
    steps = []
    original_step = llm.engine.step

    def step():  # record which slots each step mixed
        batch_slots = {s.lora_slot for s in llm.engine.scheduler.running}
        steps.append(batch_slots)
        return original_step()

    llm.engine.step = step
    mixed = tokens(llm.generate(prompts, GREEDY, lora_request=loras))
    assert any(len(slots) == 4 for slots in steps)  # three adapters and the base in one step
    base = AutoModelForCausalLM.from_pretrained(qwen2_model, dtype=torch.float32)
    expected = [reference(adapters[n][1] if n else base, p) for n in names for p in PROMPTS]
    assert mixed == expected


def test_five_adapters_through_two_slots(qwen2_model, adapters):
    llm = lora_llm(qwen2_model, max_loras=2)
    order = ["all8", "attn4", "mlp16rs", "qv2", "down8", "attn4", "all8", "down8", "qv2", "mlp16rs"]
    got = tokens(llm.generate([PROMPTS[0]] * len(order), GREEDY, lora_request=[adapters[n][0] for n in order]))
    expected = {n: reference(adapters[n][1], PROMPTS[0]) for n in ADAPTERS}
    assert got == [expected[n] for n in order]
    assert llm.engine.adapter_slots.num_loads >= 5  # slots were replaced


def test_prefix_cache_is_keyed_by_adapter(qwen2_model, adapters):
    llm = lora_llm(qwen2_model)
    prompt = list(range(30, 90))
    first = llm.generate(prompt, GREEDY, lora_request=adapters["all8"][0])[0]
    again = llm.generate(prompt, GREEDY, lora_request=adapters["all8"][0])[0]
    other = llm.generate(prompt, GREEDY, lora_request=adapters["attn4"][0])[0]
    base = llm.generate(prompt, GREEDY)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens >= 48
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0
    assert tokens([first]) == tokens([again]) != tokens([other])


@pytest.mark.parametrize("break_it, message", [
    (lambda d: (d / "adapter_model.safetensors").unlink(), "missing adapter_model.safetensors"),
    (lambda d: _edit_config(d, r=64), "max_lora_rank=16"),
    (lambda d: _edit_config(d, use_dora=True), "DoRA"),
    (lambda d: (d / "adapter_config.json").write_text("{"), "unreadable"),
])
def test_bad_adapters_are_refused_before_queueing(qwen2_model, adapters, tmp_path, break_it, message):
    import shutil

    shutil.copytree(adapters["attn4"][0].path, tmp_path / "bad")
    break_it(tmp_path / "bad")
    llm = lora_llm(qwen2_model)
    with pytest.raises(InvalidInputError, match=message) as e:
        llm.generate(PROMPTS[0], GREEDY, lora_request=LoRARequest("bad", str(tmp_path / "bad")))
    assert e.value.param == "model"
    assert tokens(llm.generate(PROMPTS[:1], GREEDY, lora_request=adapters["attn4"][0]))  # the engine goes on


def test_an_adapter_for_another_shape_is_refused(qwen2_model, adapters, tmp_path_factory):
    from testing.model_factory import build_model_dir

    wider = build_model_dir(tmp_path_factory.mktemp("wider"), "qwen2", hidden_size=96)
    with pytest.raises(InvalidInputError, match="has shape"):
        lora_llm(wider).generate(PROMPTS[0], GREEDY, lora_request=adapters["all8"][0])


def test_without_enable_lora_an_adapter_is_refused(qwen2_model, adapters):
    with pytest.raises(InvalidInputError, match="enable_lora"):
        LLM(str(qwen2_model), max_model_len=256).generate(PROMPTS[0], GREEDY, lora_request=adapters["all8"][0])


def test_tp2_with_adapters_matches_tp1(ray_cluster, qwen2_model, adapters):
    loras = [adapters[n][0] for n in ("all8", "attn4", "mlp16rs")]
    expected = tokens(lora_llm(qwen2_model).generate(PROMPTS, GREEDY, lora_request=loras))
    llm = lora_llm(qwen2_model, tensor_parallel_size=2)
    try:
        assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=loras)) == expected
    finally:
        llm.shutdown()


def _edit_config(directory, **changes):
    path = directory / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
