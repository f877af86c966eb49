"""Speculative decoding (prompt lookup) vs plain decoding: output tokens/s and per-request latency at
concurrency 1, 8 and 64, with acceptance figures, on the CPU benchmark model.

Workload (outputs that repeat spans of their prompt): each prompt is a random 8-token start, the model's own
greedy continuation of it (TEXT tokens, written by plain decoding beforehand), then the start again; each
request decodes OUTPUT greedy tokens with ignore_eos. A model with small random weights (init_std 0.02) has
strong n-gram habits, so asked to go on from the start again it writes spans it wrote before, which prompt
lookup finds in the prompt. How often it does is measured, not assumed: the acceptance rate is reported.
Its habits are mostly runs: text and outputs are largely runs of one token and short cycles (the text after
the start is not written again), so most drafts are the run the output is in, copied on at its period.
Requests are fed through the engine keeping `concurrency` in flight; both runs must yield the same tokens.
On a shared machine, `--rounds N` alternates the two N times and reports each side's fastest run.

Run: python -m benchmarks.speculative [--quick]
"""

import argparse
import random
import statistics
import time

from benchmarks.common import build_cpu_model, report
from runtime import LLM, SamplingParams

START, TEXT, OUTPUT = 8, 128, 64
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
SPEC_STATS = ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens")


def copy_workload(llm: LLM, num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = llm.engine.spec.vocab_size
    starts = [[rng.randrange(3, vocab) for _ in range(START)] for _ in range(num)]
    texts = llm.generate(starts, SamplingParams(temperature=0, max_tokens=TEXT, ignore_eos=True))
    return [s + t.outputs[0].token_ids + s for s, t in zip(starts, texts)]


def drive(llm: LLM, prompts: list[list[int]], concurrency: int) -> dict:
    """Run `prompts` keeping `concurrency` requests in flight; tokens/s, latencies and each output."""
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)
    before = llm.stats()
    queue, started, latencies, outputs = list(enumerate(prompts)), {}, [], {}
    start = time.perf_counter()
    while queue or started:
        while queue and len(started) < concurrency:
            i, prompt = queue.pop(0)
            engine.add_request(f"r{i}", prompt, params)
            started[f"r{i}"] = time.perf_counter()
        for delta in engine.step():
            outputs.setdefault(delta.request_id, []).extend(t for s in delta.seqs for t in s.token_ids)
            if delta.finished:
                latencies.append(time.perf_counter() - started.pop(delta.request_id))
    elapsed = time.perf_counter() - start
    after = llm.stats()
    spec = {k: after[k] - before[k] for k in SPEC_STATS if k in after}
    if spec:
        spec["acceptance_rate"] = spec["spec_num_accepted_tokens"] / max(1, spec["spec_num_draft_tokens"])
        spec["mean_accepted_length"] = 1 + spec["spec_num_accepted_tokens"] / max(1, spec["spec_num_drafts"])
    return {"tokens_per_s": sum(map(len, outputs.values())) / elapsed, "seconds": elapsed,
            "latency_p50_s": statistics.median(latencies), "latency_mean_s": statistics.fmean(latencies),
            "outputs": [outputs[f"r{i}"] for i in range(len(prompts))], **spec}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer requests per concurrency")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=1,
                        help="plain and speculative runs alternate this many times; each side's best is reported")
    args = parser.parse_args()
    path = build_cpu_model()
    kw = dict(dtype="float32", max_model_len=1024, max_num_seqs=64)
    plain, spec = LLM(str(path), **kw), LLM(str(path), **kw, speculative_config=NGRAM)
    for llm in (plain, spec):  # warm-up
        llm.generate([[5, 6, 7, 5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for c in args.concurrency:
        num = max(2, c) if args.quick else max(4, 2 * c) if c < 64 else c
        prompts = copy_workload(plain, num, seed=c)
        runs = [(drive(plain, prompts, c), drive(spec, prompts, c)) for _ in range(args.rounds)]
        base = max((b for b, _ in runs), key=lambda r: r["tokens_per_s"])  # the least disturbed run of each
        ours = max((o for _, o in runs), key=lambda r: r["tokens_per_s"])
        report("speculative_ngram", concurrency=c, requests=num, prompt_tokens=len(prompts[0]), output_tokens=OUTPUT,
               plain_tokens_per_s=round(base["tokens_per_s"], 1), spec_tokens_per_s=round(ours["tokens_per_s"], 1),
               speedup=round(ours["tokens_per_s"] / base["tokens_per_s"], 3),
               plain_latency_p50_s=round(base["latency_p50_s"], 3), spec_latency_p50_s=round(ours["latency_p50_s"], 3),
               plain_latency_mean_s=round(base["latency_mean_s"], 3),
               spec_latency_mean_s=round(ours["latency_mean_s"], 3),
               acceptance_rate=round(ours["acceptance_rate"], 3),
               mean_accepted_length=round(ours["mean_accepted_length"], 3),
               draft_tokens=ours["spec_num_draft_tokens"], accepted_tokens=ours["spec_num_accepted_tokens"],
               rounds=args.rounds, identical_tokens=all(b["outputs"] == o["outputs"] for b, o in runs))


if __name__ == "__main__":
    main()
