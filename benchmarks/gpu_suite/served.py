"""The served path on the device: configs/qwen.yaml's application (direct streaming: the replica answers
HTTP itself) on the suite's model, started with `serve.run` on a local Ray.

The seed documents' cells through the `openai` SDK and `requests` (chat, streamed chat, completions,
/generate, streamed /generate), the served greedy chat against the offline engine's, then streamed chats at
each concurrency against an in-process AsyncLLMEngine with the same engine options, at the same
concurrency, on the same token ids."""

import asyncio
import json
import random
from pathlib import Path

import openai
import requests
import uvloop
import yaml

from benchmarks.common import generate_concurrently
from benchmarks.gpu_suite.checks import Result, model_dir
from benchmarks.gpu_suite.sizes import Sizes
from benchmarks.online_serving import WORDS, drive
from runtime import AsyncLLMEngine, SamplingParams
from runtime.text.tokenizer import encode, render_chat
from testing.helpers import free_port

MODEL_ID = "qwen/qwen2.5-0.5b-instruct"
CAPITALS = [{"role": "user", "content": "List 3 countries and their capitals."}]


def app_args(path: Path, sizes: Sizes, storage: Path) -> dict:
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/qwen.yaml").read_text())
    args = config["applications"][0]["args"]
    llm = args["llm_configs"][0]
    llm["model_loading_config"]["model_source"] = str(path)
    llm["engine_kwargs"] = dict(sizes.engine)
    return {**args, "storage_uri": f"file://{storage}"}


def conversations(count: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [[{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(60))}] for _ in range(count)]


def finished(choice, text, usage, max_tokens: int) -> bool:
    """A reply's shape: random weights may end on their first token (an end-of-sequence id, text ""), so its text
    is only a string, but a "length" finish used every token allowed."""
    return (isinstance(text, str) and 0 < usage.completion_tokens <= max_tokens
            and choice.finish_reason in ("stop", "length")
            and (choice.finish_reason == "stop" or usage.completion_tokens == max_tokens))


def seed_cells(base: str) -> dict[str, str]:
    """Each seed cell's outcome: "ok", or what was wrong."""
    client = openai.Client(base_url=f"{base}/v1", api_key="None")
    cells = {}

    def cell(name, run):
        try:
            run()
            cells[name] = "ok"
        except Exception as e:  # noqa: BLE001 - a cell's failure is a finding, the next cell still runs
            cells[name] = f"{type(e).__name__}: {e}"[:300]

    def chat():
        reply = client.chat.completions.create(model=MODEL_ID, messages=CAPITALS, temperature=0, max_tokens=64)
        assert finished(reply.choices[0], reply.choices[0].message.content, reply.usage, 64), reply

    def chat_stream():
        chunks = list(client.chat.completions.create(model=MODEL_ID, messages=[
            {"role": "user", "content": "Say this is a test"}], stream=True, max_tokens=32))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks[-1]

    def completions():
        reply = client.completions.create(model=MODEL_ID, prompt="List 3 countries and their capitals.",
                                          temperature=0, max_tokens=64, n=1, stop=None)
        assert finished(reply.choices[0], reply.choices[0].text, reply.usage, 64), reply

    def generate():
        reply = requests.post(f"{base}/generate", json={"text": "The capital of France is", "sampling_params": {
            "temperature": 0, "max_new_tokens": 32}}, timeout=60).json()
        assert 0 < reply["meta_info"]["completion_tokens"] <= 32 and reply["text"], reply

    def generate_stream():
        with requests.post(f"{base}/generate", stream=True, timeout=60, json={
                "text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 32},
                "stream": True}) as reply:
            events = [line[5:].strip() for line in reply.iter_lines(decode_unicode=True) if line.startswith("data:")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["meta_info"]["finish_reason"], events[-2:]

    for name, run in [("chat", chat), ("chat_stream", chat_stream), ("completions", completions),
                      ("generate", generate), ("generate_stream", generate_stream)]:
        cell(name, run)
    return cells


def served(sizes: Sizes, work: Path) -> tuple[dict, str, dict]:
    """(seed cells, the greedy capitals chat's text, {concurrency: streamed output tok/s})."""
    import ray
    from ray import serve

    from deployments import build_openai_app

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        args = app_args(model_dir(sizes, work, served=True), sizes, work / "storage")
        serve.run(build_openai_app(args), route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        cells = seed_cells(base)
        client = openai.Client(base_url=f"{base}/v1", api_key="None")
        text = client.chat.completions.create(model=MODEL_ID, messages=CAPITALS, temperature=0,
                                              max_tokens=32).choices[0].message.content
        rates = {}
        for c in sizes.concurrencies:
            uvloop.run(drive(f"{base}/v1", MODEL_ID, conversations(c, 0), {"ignore_eos": True}, c,
                             sizes.served_output))  # warm-up: every batch size this level forms
            result = uvloop.run(drive(f"{base}/v1", MODEL_ID, conversations(2 * c, c), {"ignore_eos": True}, c,
                                      sizes.served_output))
            rates[c] = result["output_tok_s"]
        return cells, text, rates
    finally:
        serve.shutdown()
        ray.shutdown()


def offline(sizes: Sizes, work: Path) -> tuple[str, dict]:
    """The same greedy chat's text, and {concurrency: output tok/s} of the same streams in process."""
    engine = AsyncLLMEngine.from_options(str(model_dir(sizes, work, served=True)), **sizes.engine)
    tokenizer = engine.tokenizer

    def ids(messages) -> list[int]:
        text = render_chat(tokenizer, messages, None, None, add_generation_prompt=True)
        return encode(tokenizer, text, add_special_tokens=False)

    async def text_of(messages) -> str:
        params = SamplingParams(temperature=0, max_tokens=32)
        return "".join([s.text async for d in engine.generate(engine.validate(ids(messages), params)) for s in d.seqs])

    def rate(convs, concurrency: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=sizes.served_output, ignore_eos=True)
        requests = ((ids(messages), params) for messages in convs)  # rendered and tokenized in the timing
        seconds, tokens = asyncio.run(generate_concurrently(engine, requests, concurrency))
        return tokens / seconds

    try:
        text = asyncio.run(text_of(CAPITALS))
        rates = {}
        for c in sizes.concurrencies:
            rate(conversations(c, 0), c)
            rates[c] = round(rate(conversations(2 * c, c), c), 1)
        return text, rates
    finally:
        engine.shutdown()


def served_path(sizes: Sizes, work: Path) -> Result:
    cells, served_text, served_rates = served(sizes, work)
    offline_text, offline_rates = offline(sizes, work)
    target = sizes.targets.get("served_over_offline")
    ratios = {c: round(served_rates[c] / offline_rates[c], 3) for c in sizes.concurrencies}
    failures = [f"seed cell {name}: {outcome}" for name, outcome in cells.items() if outcome != "ok"]
    if served_text != offline_text:
        failures.append(f"served greedy chat {served_text!r} != offline {offline_text!r}")
    failures += [f"served_over_offline at concurrency {c}: {r} < target {target}"
                 for c, r in ratios.items() if target is not None and r < target]
    return (dict(seed_cells=cells, served_tok_s=served_rates, offline_tok_s=offline_rates,
                 served_over_offline=ratios, served_equals_offline=served_text == offline_text), failures)
