"""Quantized checkpoints against the unquantized model, in one run: each scheme's offline output tok/s (greedy,
concurrency 1 and 32) and the resident bytes of the projections' weights.

The checkpoints are the CPU benchmark model, quantized by compressed-tensors as llm-compressor writes
them (testing.quantized_checkpoints), or by AutoRound in GPTQ's and AWQ's layouts (`gptq`, `awq`: INT4 groups of
128 with zero points, testing.auto_round_checkpoints); the rest of the model (embeddings, LM head, norms) is
unquantized in all.

Run: python -m benchmarks.quantized [--schemes W4A16 FP8_BLOCK gptq ...]
"""

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.common import build_cpu_model, report, shared_prefix_prompts
from runtime import LLM, SamplingParams
from testing.auto_round_checkpoints import write_auto_round
from testing.quantized_checkpoints import SCHEMES, write_quantized

LAYOUTS = ("gptq", "awq")  # AutoRound's exports

OUTPUT = 64
GREEDY = SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)


def projection_bytes(llm: LLM) -> int:
    """The resident bytes of every projection's weight (quantized: codes, scales and zero points)."""
    total = 0
    for module in llm.engine.runner.model.modules():
        if getattr(module, "quantized", None) is not None:
            total += module.quantized.nbytes()
        elif hasattr(module, "matrix_shape"):
            out, inner = module.matrix_shape
            total += out * inner * 4  # float32 on CPU, packed or not
    return total


def measure(path: Path, label: str) -> dict:
    llm = LLM(str(path), dtype="float32", max_model_len=512, max_num_seqs=32)
    prompts = shared_prefix_prompts(32, 0, 64, seed=2)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    figures = {"scheme": label, "projection_weight_mib": round(projection_bytes(llm) / 2**20, 2)}
    for concurrency in (1, 32):
        batch = prompts[:concurrency] if concurrency > 1 else prompts[:4]
        start = time.perf_counter()
        if concurrency == 1:
            for prompt in batch:
                llm.generate([prompt], GREEDY)
        else:
            llm.generate(batch, GREEDY)
        figures[f"output_tok_s_c{concurrency}"] = round(len(batch) * OUTPUT / (time.perf_counter() - start), 1)
    llm.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schemes", nargs="*", default=[*SCHEMES, *LAYOUTS], choices=[*SCHEMES, *LAYOUTS])
    args = parser.parse_args()
    base = build_cpu_model()
    baseline = measure(base, "float32 (unquantized)")
    report("quantized", **baseline)
    layouts = [scheme for scheme in args.schemes if scheme in LAYOUTS]
    exported = write_auto_round(base, Path(tempfile.mkdtemp(prefix="bench-auto-round-")), 4, 128, False,
                                tuple(f"auto_{layout}" for layout in layouts)) if layouts else {}
    for scheme in args.schemes:
        path = exported.get(scheme) or write_quantized(base, Path(tempfile.mkdtemp(prefix=f"bench-{scheme.lower()}-")),
                                                       scheme)
        figures = measure(path, scheme)
        figures["weight_share_of_float32"] = round(figures["projection_weight_mib"]
                                                   / baseline["projection_weight_mib"], 3)
        for concurrency in (1, 32):
            key = f"output_tok_s_c{concurrency}"
            figures[f"speed_share_c{concurrency}"] = round(figures[key] / baseline[key], 3)
        report("quantized", **figures)


if __name__ == "__main__":
    main()
