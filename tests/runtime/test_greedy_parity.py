"""Greedy tokens equal transformers' generate on the same weights, under chunked prefill and preemption."""

import torch
from transformers import AutoModelForCausalLM

from runtime import LLM, SamplingParams
from testing.bf16_reference import assert_tokens_are_bf16_argmax
from testing.model_factory import kv_cache_bytes

WORDS = "the capital of France is Paris and the sky is blue because of scattering".split()


def _prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        text = " ".join(WORDS[j % len(WORDS)] for j in range(i * 7, i * 7 + 3 + 11 * i))
        prompts.append(tokenizer.encode(text))
    return prompts


def _reference(path, prompts, max_new_tokens, dtype=torch.float32, device="cpu"):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    refs = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=0)
        refs.append(out[0, len(ids):].tolist())
    return refs


def test_greedy_matches_transformers_with_chunking_and_preemption(any_model):
    llm = LLM(
        str(any_model),
        dtype="float32",
        max_num_batched_tokens=48,  # every prompt over 48 tokens is prefilled in chunks
        max_model_len=256,
        kv_cache_bytes=kv_cache_bytes(any_model, num_blocks=24),  # far fewer than 10 sequences need
    )
    model = llm.engine.runner.model
    if not torch.cuda.is_available():  # CPU projections go through oneDNN's packed weights
        assert model.lm_head.packed is not None and model.model.layers[0].mlp.down_proj.weight is None
    prompts = _prompts(llm.tokenizer, 10)
    assert len({len(p) for p in prompts}) == 10 and max(len(p) for p in prompts) > 100
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    expected = _reference(any_model, prompts, 40)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_fp16_and_bf16_load_and_generate(qwen2_model):
    for dtype in ("bfloat16", "float16"):
        llm = LLM(str(qwen2_model), dtype=dtype, max_model_len=128, kv_cache_bytes=1 << 20)
        assert llm.engine.runner.model.lm_head.weight.dtype == getattr(torch, dtype)  # unpacked: plain F.linear
        out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 5


def test_greedy_matches_transformers_with_a_shared_system_prompt(qwen2_model):
    """Decodes that share prefix blocks take the grouped attention path; tokens must not change."""
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    system = llm.tokenizer.encode(" ".join(WORDS * 4))
    prompts = [system + llm.tokenizer.encode(f" question {i} about {WORDS[i]}") for i in range(8)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    assert all(o.num_cached_tokens >= 48 for o in outputs[1:])
    assert [o.outputs[0].token_ids for o in outputs] == _reference(qwen2_model, prompts, 24)


def test_greedy_matches_transformers_when_one_step_prefills_more_rows_than_the_cpu_mlp_block(qwen2_model):
    """Over 512 new tokens in one step: the MLP runs in row blocks on CPU; tokens must not change."""
    from runtime.layers.mlp import _CPU_MLP_ROWS

    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, enable_prefix_caching=False)
    prompts = _prompts(llm.tokenizer, 10)
    assert sum(len(p) for p in prompts) > _CPU_MLP_ROWS
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    assert [o.outputs[0].token_ids for o in outputs] == _reference(qwen2_model, prompts, 8)


def test_bf16_greedy_tokens_are_the_references_argmax(qwen2_model):
    """bfloat16 end to end (the GPU default; on a GPU the decode steps replay CUDA graphs, a batch of 10 padded
    to a graph bucket of 16): every token is transformers' bf16 argmax, up to rounding."""
    llm = LLM(str(qwen2_model), dtype="bfloat16", max_model_len=256)
    prompts = _prompts(llm.tokenizer, 10)
    outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert (llm.engine.runner.graphs is not None) == (device == "cuda")
    assert_tokens_are_bf16_argmax(qwen2_model, prompts, outputs, device)
