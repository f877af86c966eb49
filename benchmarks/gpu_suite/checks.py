"""The suite's checks of the engine on its own: each takes the suite's sizes and a work folder (models built
there once, shared by the checks) and returns its figures and the targets they missed."""

import asyncio
import json
import platform
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch

from benchmarks.common import generate_concurrently, transformers_static_batches
from benchmarks.decode_profile import profile_decode
from benchmarks.gpu_suite.sizes import Sizes
from benchmarks.gpu_throughput import workload
from benchmarks.images import build_checkpoint, compare
from benchmarks.sampler import sampler_ms
from benchmarks.speculative import NGRAM, copy_workload, drive
from benchmarks.structured_output import SCHEMA
from runtime import LLM, AsyncLLMEngine, LoRARequest, SamplingParams
from runtime.text.grammar import Constraint
from testing.model_factory import build_model_dir
from testing.vision_checkpoints import build_llava_dir, random_picture

Result = tuple[dict, list[str]]  # (figures, failures)


def model_dir(sizes: Sizes, work: Path, served: bool = False, quantizable: bool = False) -> Path:
    """The benchmark model (built on first use), or its copy whose vocabulary is its tokenizer's (what the
    served path streams as text), or one whose widths split into groups of 128 (the dry run's tiny model's do
    not)."""
    path = work / ("served-model" if served else "quantizable-model" if quantizable else "model")
    shape = sizes.served_model if served else sizes.quantizable_model if quantizable else sizes.model
    if not (path / "config.json").exists():
        build_model_dir(path, **shape)
    return path


def sync(sizes: Sizes) -> None:
    if not sizes.dry_run:
        torch.cuda.synchronize()


def below(figure: str, value: float, target: float | None) -> list[str]:
    return [f"{figure} {value} < target {target}"] if target is not None and value < target else []


def environment(sizes: Sizes, work: Path) -> Result:
    import transformers
    import triton

    figures = dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
                   transformers=transformers.__version__, cuda=torch.version.cuda)
    if not sizes.dry_run:
        props = torch.cuda.get_device_properties(0)
        figures.update(device=props.name, capability=f"{props.major}.{props.minor}",
                       memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count)
    return figures, []


def engine_tests(sizes: Sizes, work: Path) -> Result:
    """The engine's own tests on this device: kernels against their references, greedy parity with
    transformers (dense, MoE and sliding-window families), CUDA graphs, async scheduling on = off."""
    junit = work / "engine-tests.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                           *sizes.tests])
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    for case in cases:
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcome = {"failure": "failed", "error": "failed"}.get(outcome, outcome)
        counts[outcome] += 1
        if outcome == "failed":
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    failures = [f"pytest exited {done.returncode}"] if done.returncode else []
    return {**counts, "failed_tests": failed}, failures + failed


def throughput(sizes: Sizes, work: Path, async_scheduling: bool) -> Result:
    """nano-vllm's benchmark: `sequences` random prompts and output lengths, greedy, ignore_eos."""
    requests = workload(sizes.sequences, lengths=sizes.lengths, vocab=sizes.model.get("vocab_size", 512))
    llm = LLM(str(model_dir(sizes, work)), **sizes.engine, async_scheduling=async_scheduling)
    llm.generate([requests[0][0]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=out, ignore_eos=True) for _, out in requests]
    sync(sizes)
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    sync(sizes)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    rate = round(tokens / seconds)
    wrong = [] if tokens == sum(out for _, out in requests) else [f"{tokens} tokens, not what was asked"]
    return (dict(async_scheduling=async_scheduling, sequences=sizes.sequences, output_tokens=tokens,
                 seconds=round(seconds, 2), output_tok_s=rate),
            wrong + below("output_tok_s", rate, sizes.targets.get("output_tok_s")))


def sampler(sizes: Sizes, work: Path) -> Result:
    """The sampler alone on [sequences x sampler_vocab] logits (on a GPU, Qwen's 151,936): greedy, temperature 1
    (unseeded and seeded), temperature 0.7 with top_p 0.9."""
    rows, vocab = sizes.sequences, sizes.sampler_vocab
    return dict(rows=rows, vocab=vocab, **sampler_ms(rows, vocab, torch.device(sizes.device))), []


def transformers_generate(sizes: Sizes, work: Path) -> Result:
    from transformers import AutoModelForCausalLM

    requests = workload(sizes.sequences, lengths=sizes.lengths, vocab=sizes.model.get("vocab_size", 512))
    requests = [(prompt, min(out, sizes.hf_max_output)) for prompt, out in requests[: sizes.hf_sequences]]
    model = AutoModelForCausalLM.from_pretrained(model_dir(sizes, work), dtype=sizes.model["dtype"])
    model = model.to(sizes.device).eval()
    sync(sizes)
    start = time.perf_counter()
    tokens = transformers_static_batches(model, [p for p, _ in requests], [out for _, out in requests],
                                         batch_size=sizes.hf_sequences)
    sync(sizes)
    seconds = time.perf_counter() - start
    return dict(sequences=len(requests), output_tokens=tokens, output_tok_s=round(tokens / seconds)), []


def decode_profile(sizes: Sizes, work: Path) -> Result:
    llm = LLM(str(model_dir(sizes, work)), **{**sizes.engine, "max_num_seqs": sizes.decode_batch})
    return profile_decode(llm.engine, sizes.decode_batch, sizes.decode_context, sizes.decode_steps), []


def lora(sizes: Sizes, work: Path) -> Result:
    """`adapters` random PEFT adapters of rank `rank`, mixed in one batch, against the base alone."""
    from testing.lora_adapters import ALL, make_adapter

    path = model_dir(sizes, work)
    loras = []
    for i in range(sizes.adapters):
        make_adapter(path, work / f"adapter{i}", sizes.rank, 2 * sizes.rank, ALL, False, seed=i)
        loras.append(LoRARequest(f"a{i}", str(work / f"adapter{i}")))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(100)] for _ in range(sizes.feature_requests)]
    params = SamplingParams(temperature=0, max_tokens=sizes.feature_output, ignore_eos=True)
    llm = LLM(str(path), **sizes.engine, enable_lora=True, max_loras=sizes.adapters, max_lora_rank=sizes.rank)

    def rate(lora_requests) -> float:
        llm.generate(prompts[:4], params, lora_request=lora_requests and lora_requests[:4])  # warm-up
        sync(sizes)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=lora_requests)
        sync(sizes)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)

    base = rate(None)
    mixed = rate([loras[i % len(loras)] for i in range(len(prompts))])
    ratio = round(mixed / base, 3)
    return (dict(adapters=sizes.adapters, rank=sizes.rank, requests=len(prompts), base_tok_s=round(base),
                 mixed_adapters_tok_s=round(mixed), lora_over_base=ratio),
            below("lora_over_base", ratio, sizes.targets.get("lora_over_base")))


def quantized(sizes: Sizes, work: Path) -> Result:
    """The model quantized (INT4 groups of 128 by compressed-tensors; FP8 128x128 blocks by transformers'
    FineGrainedFP8) against itself unquantized: output tok/s over the same prompts, and the quantized
    projections' resident bytes. Each engine is shut down before the next starts."""
    from testing.quantized_checkpoints import write_fine_grained_fp8, write_quantized

    base = model_dir(sizes, work, quantizable=True)
    paths = {"base": base, "w4a16": write_quantized(base, work / "w4a16", "W4A16"),
             "fp8_block": write_fine_grained_fp8(base, work / "fp8-block")}
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 500) for _ in range(100)] for _ in range(sizes.feature_requests)]
    params = SamplingParams(temperature=0, max_tokens=sizes.feature_output, ignore_eos=True)
    figures = {}
    for name, path in paths.items():
        llm = LLM(str(path), **sizes.engine)
        llm.generate(prompts[:4], params)  # warm-up
        sync(sizes)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        sync(sizes)
        figures[f"{name}_tok_s"] = round(sum(len(o.outputs[0].token_ids) for o in outputs)
                                         / (time.perf_counter() - start))
        if name != "base":
            weights = [m.quantized for m in llm.engine.runner.model.modules()
                       if getattr(m, "quantized", None) is not None]
            figures[f"{name}_projection_mib"] = round(sum(w.nbytes() for w in weights) / 2**20, 1)
        llm.shutdown()
    for name in ("w4a16", "fp8_block"):
        figures[f"{name}_over_base"] = round(figures[f"{name}_tok_s"] / figures["base_tok_s"], 3)
    return figures, []


def structured(sizes: Sizes, work: Path) -> Result:
    """JSON-schema decoding (the token bitmask applied on the device) against unconstrained, same prompts."""
    engine = AsyncLLMEngine.from_options(str(model_dir(sizes, work)), **sizes.engine)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(100)] for _ in range(sizes.feature_requests)]
    constraint = Constraint("json_schema", json.dumps(SCHEMA))

    def run(constrained: bool, count: int) -> float:
        def params(i: int) -> SamplingParams:
            return SamplingParams(temperature=1.0, seed=i, max_tokens=sizes.feature_output, ignore_eos=not constrained,
                                  structured_output=constraint if constrained else None)

        requests = [(prompts[i], params(i)) for i in range(count)]
        seconds, tokens = asyncio.run(generate_concurrently(engine, requests, sizes.structured_concurrency))
        return tokens / seconds

    run(True, 4)  # warm-up; the grammar compiles once
    free = run(False, len(prompts))
    constrained = run(True, len(prompts))
    engine.shutdown()
    ratio = round(constrained / free, 3)
    return (dict(concurrency=sizes.structured_concurrency, requests=len(prompts), unconstrained_tok_s=round(free),
                 json_schema_tok_s=round(constrained), structured_over_unconstrained=ratio),
            below("structured_over_unconstrained", ratio, sizes.targets.get("structured_over_unconstrained")))


def speculative(sizes: Sizes, work: Path) -> Result:
    """Prompt-lookup speculative decoding at concurrency 1 against plain decoding: same tokens, and how much
    faster."""
    path = model_dir(sizes, work)
    # float32: in bf16 a verification step's batch shape (several tokens a sequence) rounds differently from a
    # decode step's, and a random model's near-ties break either way
    options = {**sizes.engine, "max_num_seqs": 8, "dtype": "float32"}
    plain, spec = LLM(str(path), **options), LLM(str(path), **options, speculative_config=NGRAM)
    for llm in (plain, spec):  # warm-up
        llm.generate([[5, 6, 7, 5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    prompts = copy_workload(plain, sizes.speculative_requests)
    base, ours = drive(plain, prompts, 1), drive(spec, prompts, 1)
    same = base["outputs"] == ours["outputs"]
    return (dict(requests=len(prompts), plain_tok_s=round(base["tokens_per_s"], 1),
                 spec_tok_s=round(ours["tokens_per_s"], 1),
                 speedup=round(ours["tokens_per_s"] / base["tokens_per_s"], 3),
                 acceptance_rate=round(ours["acceptance_rate"], 3), identical_tokens=same),
            [] if same else ["speculative decoding changed the greedy tokens"])


def vision(sizes: Sizes, work: Path) -> Result:
    """A vision-language model (LLaVA's shape, 256 tokens a picture) against transformers' class: time to first
    token of a one-picture chat, cold and with the picture's prefix cached, and pictures per second through the
    encoder (`benchmarks.images`). On the GPU, a cached picture must answer sooner than a cold one."""
    path = work / "llava"
    if not (path / "config.json").exists():  # the dry run's: the tests' tiny LLaVA
        build_llava_dir(path) if sizes.dry_run else build_checkpoint(path)
    pictures = [random_picture(seed, (320, 240)) for seed in range(sizes.vision_pictures)]
    figures = compare(path, pictures, sizes.device, "float32" if sizes.dry_run else "bfloat16")
    ours = figures["ours"]
    slower = not sizes.dry_run and ours["ttft_cached_s"] >= ours["ttft_cold_s"]  # the tiny model's prefill is free
    return figures, [f"cached TTFT {ours['ttft_cached_s']:.4f} s not below cold {ours['ttft_cold_s']:.4f} s"] * slower
