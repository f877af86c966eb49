"""What sampling costs. The sampler alone: ms per call on [rows x vocab] float32 logits (a real model's
vocabulary: Qwen's 151,936) at greedy, temperature 1 (unseeded and seeded) and temperature 0.7 with top_p 0.9;
the median of REPEATS calls after a warm-up. Then the offline engine's output tokens/s on the tiny test model
and on the CPU benchmark model, 256 prompts of 32 tokens, 32 output tokens each with ignore_eos, at the
same three settings against greedy in the same process (passes alternate; each setting's best of PASSES).

Run: python -m benchmarks.sampler [--rows 256] [--vocab 151936]
"""

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams
from runtime.core.sequence import Request
from runtime.worker.sampler import Sampler

REPEATS, PASSES = 5, 3
ENGINE_CASES = {"greedy": dict(temperature=0), "temperature_1": dict(temperature=1.0),
                "temperature_0.7_top_p_0.9": dict(temperature=0.7, top_p=0.9)}
CASES = {
    "greedy": dict(temperature=0),
    "temperature_1": dict(temperature=1.0),
    "temperature_1_seeded": dict(temperature=1.0, seed=7),
    "temperature_0.7_top_p_0.9": dict(temperature=0.7, top_p=0.9),
}


def sampler_ms(rows: int, vocab: int, device: torch.device) -> dict:
    """The sampler alone: each case's median ms per call on [rows x vocab] float32 logits on `device`."""
    torch.manual_seed(0)
    logits = torch.randn(rows, vocab, device=device) * 3
    sampler = Sampler({0}, device)
    figures = {}
    for name, fields in CASES.items():
        seqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(**fields), 0).seqs[0] for i in range(rows)]
        sampler.sample(logits, seqs)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            sampler.sample(logits, seqs)[0].cpu()  # waits for the device
            times.append(time.perf_counter() - start)
        figures[f"{name}_ms"] = round(1e3 * statistics.median(times), 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()
    report("sampler", rows=args.rows, vocab=args.vocab, threads=torch.get_num_threads(),
           **sampler_ms(args.rows, args.vocab, torch.device("cpu")))
    from testing.model_factory import build_model_dir

    for name, path in (("tiny", build_model_dir(Path(tempfile.mkdtemp(prefix="bench-tiny-")))),
                       ("cpu_benchmark", build_cpu_model())):
        report("sampling_throughput", model=name, **engine_rates(path))


def engine_rates(path: Path) -> dict:
    llm = LLM(str(path), max_model_len=256, max_num_seqs=256)
    vocab = llm.engine.spec.vocab_size
    rng = random.Random(0)
    best = dict.fromkeys(ENGINE_CASES, 0.0)
    for _ in range(PASSES):
        for name, fields in ENGINE_CASES.items():
            prompts = [[rng.randrange(3, vocab) for _ in range(32)] for _ in range(256)]  # fresh: no cache hits
            params = SamplingParams(max_tokens=32, ignore_eos=True, **fields)
            start = time.perf_counter()
            tokens = sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, params))
            best[name] = max(best[name], tokens / (time.perf_counter() - start))
    return {f"{name}_tok_s": round(rate) for name, rate in best.items()} | {
        f"{name}_over_greedy": round(best[name] / best["greedy"], 3) for name in ENGINE_CASES if name != "greedy"}


if __name__ == "__main__":
    main()
