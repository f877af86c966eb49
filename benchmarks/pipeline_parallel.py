"""Pipeline parallelism: PP=2 against PP=1 offline throughput at 256 sequences on the CPU benchmark model
(or, with --device cuda and two GPUs, on them), and the pipeline's bubble: the share of rank 0's pipeline passes
that its stage spends waiting for the other stage rather than running its own layers.

On CPU, PP=1 runs in this process on every core torch takes; each PP=2 stage is a process of one core (Ray's
default for a worker of num_cpus 1, and rank 0 is limited to match), so the stages' cores are the same in total.
Run: python -m benchmarks.pipeline_parallel [--sequences 256] [--output 32]
"""

import argparse
import time

import ray
import torch

from benchmarks.common import build_cpu_model, report, shared_prefix_prompts
from runtime import LLM, SamplingParams


def measure(path, pp: int, prompts: list[list[int]], output: int, device: str) -> dict:
    llm = LLM(str(path), max_model_len=1024, pipeline_parallel_size=pp, device=device)
    runner = llm.engine.runner
    passes, stage = [], []
    if runner.pipeline is not None:
        run, forward = runner.pipeline.run, runner._stage_forward

        def timed_run(inputs, stage_forward):
            start = time.perf_counter()
            hidden = run(inputs, stage_forward)
            passes.append(time.perf_counter() - start)
            return hidden

        def timed_forward(*args):
            start = time.perf_counter()
            out = forward(*args)
            if device == "cuda":
                torch.cuda.synchronize()
            stage.append(time.perf_counter() - start)
            return out

        runner.pipeline.run, runner._stage_forward = timed_run, timed_forward
    try:
        params = SamplingParams(temperature=0, max_tokens=output, ignore_eos=True)
        llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
        passes.clear(), stage.clear()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        figures = {"output_tok_s": round(sum(len(o.outputs[0].token_ids) for o in outputs) / seconds, 1),
                   "seconds": round(seconds, 2)}
        if passes:
            figures["bubble_share_of_rank0_passes"] = round(1 - sum(stage) / sum(passes), 3)
            figures["pipeline_passes"] = len(passes)
        return figures, [o.outputs[0].token_ids for o in outputs]
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    path = build_cpu_model()
    prompts = shared_prefix_prompts(args.sequences, 64, 32)
    threads = torch.get_num_threads()
    pp1, tokens1 = measure(path, 1, prompts, args.output, args.device)
    torch.set_num_threads(1)  # rank 0's stage gets one core, as each worker stage does
    pp2, tokens2 = measure(path, 2, prompts, args.output, args.device)
    torch.set_num_threads(threads)
    report("pipeline_parallel", sequences=args.sequences, output_tokens=args.output, torch_threads_pp1=threads,
           same_tokens=tokens1 == tokens2, pp1=pp1, pp2=pp2)


if __name__ == "__main__":
    main()
