"""Offline throughput: our LLM.generate vs transformers generate (static batches of 32) and
generate_batch (its continuous batching), on the CPU benchmark model.

Workload: 64 requests, a shared ~250-token system prompt plus a unique ~30-token
question each, 64 greedy output tokens with ignore_eos. Also reported: the
matmul roofline and our fraction of it, prefix caching on vs off with a
1,000-token shared prefix, and the per-step CPU overhead of scheduling and
input preparation with few vs many waiting requests.

Run: python -m benchmarks.offline_throughput
"""

import time

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from benchmarks.common import (
    build_cpu_model,
    matmul_flops_per_second,
    matmul_params,
    report,
    shared_prefix_prompts,
    transformers_static_batches,
)
from runtime import LLM, SamplingParams

NUM_REQUESTS, PREFIX, QUESTION, OUTPUT = 64, 250, 30, 64
GREEDY = SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)


def ours(path, prompts, **kw) -> tuple[float, list]:
    llm = LLM(str(path), **kw)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, GREEDY)
    return time.perf_counter() - start, outputs


def hf_static(model, prompts) -> float:
    start = time.perf_counter()
    transformers_static_batches(model, prompts, [OUTPUT] * len(prompts))
    return time.perf_counter() - start


def hf_continuous(model, prompts) -> float:
    config = GenerationConfig(do_sample=False, max_new_tokens=OUTPUT, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    model.generate_batch(prompts, generation_config=config)
    return time.perf_counter() - start


def step_overhead(path, waiting: int) -> float:
    """Mean seconds of scheduling + input preparation per step, with `waiting` requests queued."""
    llm = LLM(str(path), max_num_seqs=32, max_model_len=512)
    engine = llm.engine
    for i, p in enumerate(shared_prefix_prompts(32 + waiting, PREFIX, QUESTION, seed=1)):
        engine.add_request(f"r{i}", p, GREEDY)
    for _ in range(3):
        engine.step()  # the 32 running sequences are decoding now
    total, steps = 0.0, 20
    for _ in range(steps):
        start = time.perf_counter()
        batch = engine.scheduler.schedule()
        inputs, *_ = engine.runner.prepare(batch)
        engine.runner.attention_metadata(inputs)
        total += time.perf_counter() - start
        for s, n in zip(batch.seqs, batch.num_new_tokens):  # finish the step without the model
            s.num_computed_tokens += n
            if s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(5)
    return total / steps


def main() -> None:
    path = build_cpu_model()
    prompts = shared_prefix_prompts(NUM_REQUESTS, PREFIX, QUESTION)
    output_tokens = NUM_REQUESTS * OUTPUT

    seconds, outputs = ours(path, prompts, max_model_len=1024)
    assert all(len(o.outputs[0].token_ids) == OUTPUT for o in outputs)
    ours_tps = output_tokens / seconds
    cached = sum(o.num_cached_tokens for o in outputs)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    static_tps = output_tokens / hf_static(model, prompts)
    continuous_tps = output_tokens / hf_continuous(model, prompts)

    gemm_rates = matmul_flops_per_second()
    flops = max(gemm_rates.values())
    params = matmul_params(model)
    roofline_tps = flops / (2 * params)
    report("offline_throughput", requests=NUM_REQUESTS, output_tokens=output_tokens,
           ours_tok_s=round(ours_tps, 1), hf_generate_static32_tok_s=round(static_tps, 1),
           hf_generate_batch_tok_s=round(continuous_tps, 1), speedup_vs_static=round(ours_tps / static_tps, 2),
           speedup_vs_generate_batch=round(ours_tps / continuous_tps, 2), prompt_tokens_from_cache=cached,
           matmul_gflop_s={name: round(rate / 1e9, 1) for name, rate in gemm_rates.items()},
           matmul_params=params, roofline_tok_s=round(roofline_tps, 1),
           fraction_of_roofline=round(ours_tps / roofline_tps, 3), threads=torch.get_num_threads())

    long_prompts = shared_prefix_prompts(16, 1000, QUESTION, seed=2)
    on, _ = ours(path, long_prompts, max_model_len=2048)
    off, _ = ours(path, long_prompts, max_model_len=2048, enable_prefix_caching=False)
    report("prefix_caching_1000_token_prefix", requests=16, seconds_cache_on=round(on, 2),
           seconds_cache_off=round(off, 2), speedup=round(off / on, 2))

    few, many = step_overhead(path, 10), step_overhead(path, 2000)
    report("per_step_cpu_overhead", running=32, us_with_10_waiting=round(few * 1e6),
           us_with_2000_waiting=round(many * 1e6))


if __name__ == "__main__":
    main()
