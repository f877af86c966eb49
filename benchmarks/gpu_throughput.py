"""GPU throughput: a random-weight model of the Qwen2.5-0.5B shape in bf16 (no hub), 256 sequences with
input and output lengths uniform in 100-1024 and ignore_eos; our output tokens/s, transformers `generate`
on the same weights in the same run, and the bandwidth roofline (bytes read per decode step / measured
copy bandwidth).

Run on a CUDA machine: python -m benchmarks.gpu_throughput  [--hf-sequences 64] [--enforce-eager]
"""

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.common import report, transformers_static_batches
from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir

QWEN25_05B = dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                  num_kv_heads=2, vocab_size=151936, max_positions=32768, tie_word_embeddings=True,
                  init_std=0.02, tokenizer_vocab=512, dtype=torch.bfloat16, rope_theta=1_000_000.0)


def workload(n: int, seed: int = 0, lengths: tuple[int, int] = (100, 1024), vocab: int = 151936
             ) -> list[tuple[list[int], int]]:
    """`n` (prompt, output length) pairs, both lengths uniform in `lengths`."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(*lengths))], rng.randint(*lengths))
            for _ in range(n)]


def copy_bandwidth(gib: int = 4) -> float:
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * 10 * src.numel() / (time.perf_counter() - start)  # read + write bytes per second


def ours(path: Path, requests, enforce_eager: bool) -> tuple[float, int]:
    llm = LLM(str(path), dtype="bfloat16", max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=16384,
              enforce_eager=enforce_eager)
    llm.generate([requests[0][0]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=out, ignore_eos=True) for _, out in requests]
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    torch.cuda.synchronize()
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)


def transformers_generate(path: Path, requests) -> tuple[float, int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = transformers_static_batches(model, [p for p, _ in requests], [out for _, out in requests])
    torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--hf-sequences", type=int, default=64)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    args = parser.parse_args()
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="qwen05b-")), **QWEN25_05B)
    requests = workload(args.sequences)
    seconds, tokens = ours(path, requests, args.enforce_eager)
    hf_seconds, hf_tokens = transformers_generate(path, requests[: args.hf_sequences])
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    bandwidth = copy_bandwidth()
    # a decode step reads every weight once and each running sequence's KV (at mean context ~1100 tokens)
    kv_bytes_per_token = 2 * 24 * 2 * 64 * 2
    batch = min(256, args.sequences)
    step_bytes = params * 2 + batch * 1100 * kv_bytes_per_token
    roofline = batch * bandwidth / step_bytes
    report("gpu_throughput", sequences=args.sequences, enforce_eager=args.enforce_eager, output_tokens=tokens,
           ours_tok_s=round(tokens / seconds),
           transformers_generate_tok_s=round(hf_tokens / hf_seconds), hf_sequences=args.hf_sequences,
           copy_bandwidth_gb_s=round(bandwidth / 1e9), roofline_tok_s=round(roofline),
           fraction_of_roofline=round(tokens / seconds / roofline, 3), device=torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
