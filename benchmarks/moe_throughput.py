"""Mixture-of-experts offline throughput on CPU: our LLM.generate vs transformers generate (static batches of
32) on the same requests, in one run, on a tiny Qwen3-MoE (8 experts, top-2, 4 layers, float32), or with
`--arch deepseek_v3` a tiny DeepSeek-V3 of the same size (latent attention with kv_lora_rank 128, 8 experts in 4
groups, top-2 within the best 2 groups, a shared expert, the first layer dense), or with `--arch qwen3_next` a
tiny Qwen3-Next of the same size (linear attention with 4 key and 8 value heads of 64 on three layers of four, gated
full attention on the fourth; 8 experts, top-2, a gated shared expert).

Workload: 64 requests, a shared ~100-token system prompt plus a unique ~20-token question each, 32 greedy
output tokens with ignore_eos. Both sides' greedy tokens for the first request are compared.

Run: python -m benchmarks.moe_throughput [--arch deepseek_v3 | qwen3_next]
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.common import report, shared_prefix_prompts, transformers_static_batches
from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir

MOE_MODEL = dict(arch="qwen3_moe", hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                 num_kv_heads=2, head_dim=64, vocab_size=8192, max_positions=1024, init_std=0.02, num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=256)
MLA_MOE_MODEL = dict(arch="deepseek_v3", hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                     num_kv_heads=4, vocab_size=8192, max_positions=1024, init_std=0.02, n_routed_experts=8,
                     num_experts_per_tok=2, n_group=4, topk_group=2, moe_intermediate_size=256, n_shared_experts=1,
                     first_k_dense_replace=1, kv_lora_rank=128, q_lora_rank=192, qk_rope_head_dim=32,
                     qk_nope_head_dim=64, v_head_dim=64, head_dim=32)
HYBRID_MOE_MODEL = dict(MOE_MODEL, arch="qwen3_next", full_attention_interval=4, linear_num_key_heads=4,
                        linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
                        shared_expert_intermediate_size=256, mlp_only_layers=[])
MODELS = {"qwen3_moe": MOE_MODEL, "deepseek_v3": MLA_MOE_MODEL, "qwen3_next": HYBRID_MOE_MODEL}
NUM_REQUESTS, PREFIX, QUESTION, OUTPUT = 64, 100, 20, 32
GREEDY = SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", choices=list(MODELS), default="qwen3_moe")
    shape = MODELS[parser.parse_args().arch]
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="bench-moe-")), **shape)
    prompts = shared_prefix_prompts(NUM_REQUESTS, PREFIX, QUESTION)
    output_tokens = NUM_REQUESTS * OUTPUT

    llm = LLM(str(path), max_model_len=512)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, GREEDY)
    ours = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == OUTPUT for o in outputs)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    transformers_static_batches(model, prompts[:2], [2, 2])  # warm-up
    start = time.perf_counter()
    transformers_static_batches(model, prompts, [OUTPUT] * NUM_REQUESTS)
    static = time.perf_counter() - start
    first = model.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=OUTPUT, min_new_tokens=OUTPUT,
                           pad_token_id=0)[0, len(prompts[0]):].tolist()

    params = sum(p.numel() for p in model.parameters())
    experts = shape.get("num_experts") or shape["n_routed_experts"]
    report("moe_offline_throughput", model=shape["arch"], experts=experts, top_k=shape["num_experts_per_tok"],
           params=params, requests=NUM_REQUESTS, output_tokens=output_tokens,
           ours_tok_s=round(output_tokens / ours, 1), hf_generate_static32_tok_s=round(output_tokens / static, 1),
           speedup_vs_static=round(static / ours, 2),
           first_request_tokens_equal=first == outputs[0].outputs[0].token_ids,
           prompt_tokens_from_cache=sum(o.num_cached_tokens for o in outputs),
           hf_experts_implementation=getattr(model.config, "_experts_implementation", None),
           threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
