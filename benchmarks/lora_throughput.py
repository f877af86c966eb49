"""Multi-LoRA throughput: 64 requests spread over 8 adapters against the same requests on the base model alone,
same run, the CPU benchmark model, with transformers + PEFT as the peer.

Each adapter is a random PEFT adapter of rank 16 on all seven projections. Workload: 64 requests (a unique
~100-token prompt each), 64 greedy output tokens with ignore_eos. Ours: one engine with 8 adapter slots
(`enable_lora`, `max_loras=8`), every request in one `generate` call, so steps mix all 8 adapters; the base
runs on an engine without LoRA. The peer: PEFT's mixed-adapter batches (`adapter_names=` per row) in static
batches of 32. Median of PASSES passes after a warm-up pass.

Run: python -m benchmarks.lora_throughput
"""

import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import build_cpu_model, report
from runtime import LLM, LoRARequest, SamplingParams
from testing.lora_adapters import ALL, make_adapter

ADAPTERS, NUM_REQUESTS, PROMPT, OUTPUT, PASSES, RANK = 8, 64, 100, 64, 3, 16
GREEDY = SamplingParams(temperature=0, max_tokens=OUTPUT, ignore_eos=True)


def median_tok_s(run) -> tuple[float, list[float]]:
    run(NUM_REQUESTS)  # warm-up: a whole pass, so every batch shape has run once
    rates = []
    for _ in range(PASSES):
        start = time.perf_counter()
        tokens = run(NUM_REQUESTS)
        rates.append(round(tokens / (time.perf_counter() - start), 1))
    return statistics.median(rates), rates


def main() -> None:
    path = build_cpu_model()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 8192) for _ in range(PROMPT)] for _ in range(NUM_REQUESTS)]
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    loras, peft_model = [], None
    for i in range(ADAPTERS):
        made = make_adapter(path, root / f"a{i}", RANK, 2 * RANK, ALL, False, seed=i)
        loras.append(LoRARequest(f"a{i}", str(root / f"a{i}")))
        if peft_model is None:
            peft_model = made
        else:
            peft_model.load_adapter(str(root / f"a{i}"), adapter_name=f"a{i}")
    spread = [loras[i % ADAPTERS] for i in range(NUM_REQUESTS)]

    base_llm = LLM(str(path), max_model_len=1024)
    base, base_passes = median_tok_s(lambda n: sum(len(o.outputs[0].token_ids)
                                                   for o in base_llm.generate(prompts[:n], GREEDY)))
    lora_llm = LLM(str(path), max_model_len=1024, enable_lora=True, max_loras=ADAPTERS, max_lora_rank=RANK)
    mixed, mixed_passes = median_tok_s(lambda n: sum(len(o.outputs[0].token_ids) for o in lora_llm.generate(
        prompts[:n], GREEDY, lora_request=spread[:n])))
    base_on_lora_engine, _ = median_tok_s(lambda n: sum(len(o.outputs[0].token_ids)
                                                        for o in lora_llm.generate(prompts[:n], GREEDY)))

    names = ["default" if i == 0 else f"a{i}" for i in range(ADAPTERS)]  # PEFT's first adapter is "default"

    def peft_batches(n: int) -> int:
        tokens = 0
        for start in range(0, n, 32):
            rows = list(range(start, min(start + 32, n)))
            with torch.no_grad():
                peft_model.generate(input_ids=torch.tensor([prompts[i] for i in rows]), do_sample=False,
                                    max_new_tokens=OUTPUT, min_new_tokens=OUTPUT, pad_token_id=0,
                                    adapter_names=[names[i % ADAPTERS] for i in rows])
            tokens += OUTPUT * len(rows)
        return tokens

    peer, peer_passes = median_tok_s(peft_batches)
    report("lora_throughput", adapters=ADAPTERS, requests=NUM_REQUESTS, rank=RANK,
           base_tok_s=base, base_passes=base_passes, mixed_adapters_tok_s=mixed, mixed_passes=mixed_passes,
           base_on_lora_engine_tok_s=base_on_lora_engine, mixed_over_base=round(mixed / base, 3),
           peft_mixed_batches_tok_s=peer, peft_passes=peer_passes, ours_over_peft=round(mixed / peer, 2))


if __name__ == "__main__":
    main()
