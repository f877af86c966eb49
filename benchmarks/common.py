"""Shared pieces of the benchmarks: the benchmark model, the workload, the machine's matmul roofline."""

import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from kernels import linear, pack_weight
from kernels.linear import pack_onednn
from testing.model_factory import build_model_dir

# The CPU benchmark model (docs/performance.md): Qwen2-shaped, about 28M parameters, float32
CPU_MODEL = dict(arch="qwen2", hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                 num_kv_heads=2, vocab_size=8192, max_positions=4096, init_std=0.02)


def build_cpu_model() -> Path:
    return build_model_dir(Path(tempfile.mkdtemp(prefix="bench-model-")), **CPU_MODEL)


def shared_prefix_prompts(num: int, prefix_len: int, question_len: int, vocab: int = 8192, seed: int = 0):
    """`num` prompts: one shared system prefix, then a unique question each (token ids)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(question_len)] for _ in range(num)]


def matmul_flops_per_second(n: int = 1024, repeats: int = 20) -> dict[str, float]:
    """FLOP/s of an n x n x n fp32 matmul through each CPU GEMM we have: MKL (`torch.mm`, what `F.linear`
    uses), oneDNN with a packed weight, and our packed tiles (`kernels.cpu.grouped_matmul`, what our engine
    uses where they apply). The roofline takes the best."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    onednn, tiles = pack_onednn(b), pack_weight(b)
    gemms = {"mkl": lambda: torch.mm(a, b), "onednn_packed": lambda: linear(a, None, packed=onednn),
             "tiled": lambda: linear(a, None, packed=tiles)}
    rates = {}
    for name, gemm in gemms.items():
        gemm()
        start = time.perf_counter()
        for _ in range(repeats):
            gemm()
        rates[name] = 2 * n**3 * repeats / (time.perf_counter() - start)
    return rates


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in a matmul per token: everything but the input embedding table."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return total if tied else total - embed


def transformers_static_batches(model, prompts: list[list[int]], new_tokens: list[int], batch_size: int = 32) -> int:
    """transformers `generate` over left-padded static batches of `batch_size` prompts, greedy, each batch
    run to its longest `new_tokens` with EOS ignored (as a static batch must). Returns the tokens generated."""
    tokens = 0
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        new = max(new_tokens[i : i + batch_size])
        model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                       min_new_tokens=new, pad_token_id=0)
        tokens += new * len(batch)
    return tokens


async def generate_concurrently(engine, requests, concurrency: int) -> tuple[float, int]:
    """Stream every (prompt, SamplingParams) of `requests` through an AsyncLLMEngine, `concurrency` at a time: the
    seconds it took and the output tokens. A generator's items are made inside the timing (a template rendered,
    say), as a server makes them."""
    limit, tokens = asyncio.Semaphore(concurrency), 0

    async def one(prompt, params) -> None:
        nonlocal tokens
        async with limit:
            async for delta in engine.generate(engine.validate(prompt, params)):
                tokens += len(delta.seqs[0].token_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(prompt, params) for prompt, params in requests))
    return time.perf_counter() - start, tokens


def report(name: str, **figures) -> None:
    print(json.dumps({"benchmark": name, **figures}), flush=True)
