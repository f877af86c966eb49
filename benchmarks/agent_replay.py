"""Coding-agent sessions replayed against three replicas behind two ingress replicas: the share of each turn's
prompt served from the prefix cache, with the prefix-aware router (deployments/prefix_router.py) reading what
the replicas' engines report they hold (KV-aware), the same router on its own sends alone, and Serve's
power-of-two-choices router (random for this purpose), one session alone and 20 interleaved.

    python -m benchmarks.agent_replay [--sessions 20] [--turns 20] [--kv-cache-mb 256]

A session is a system prompt with tool definitions, then turns that each add a user message or a tool result of a
few hundred tokens and the model's tool call (forced, so every run sends the same prompts): the prompt grows past
8,000 tokens by the last turn, as a coding agent's does. The model is the tests' tiny Qwen2 (a 16k context): the
figures are about routing and caching, not speed; the replicas share the machine's cores.
"""

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import openai

from benchmarks.common import report
from testing.helpers import free_port
from testing.model_factory import build_model_dir

MODEL_ID = "agent-model"
ROUTERS = {"kv_aware": {},
           # the same router on what it sent where alone, each ingress replica's router on its own
           "prefix_aware_sends_only": {"request_router_class": "deployments.prefix_router:PrefixAwareRouter",
                                       "request_router_kwargs": {"engine_reports": False}},
           "random": {"request_router_class": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"}}
WORDS = ("def return import class self value list dict error test file path line read write open close config "
         "model token cache replica request response stream batch engine kernel tensor shape index").split()
TOOL = {"type": "function", "function": {"name": "run", "description": "Run a shell command in the repository",
                                         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                        "required": ["cmd"]}}}


def app_args(model_dir: Path, router: dict, kv_cache_mb: int) -> dict:
    return {"llm_configs": [{
        "model_loading_config": {"model_id": MODEL_ID, "model_source": str(model_dir)},
        "engine_kwargs": {"max_model_len": 16384, "kv_cache_bytes": kv_cache_mb << 20, "max_num_batched_tokens": 2048},
        "tool_call_parser": "qwen25",
        "deployment_config": {"num_replicas": 3, "ray_actor_options": {"num_cpus": 1},
                              **({"request_router_config": router} if router else {})}}],
        "storage_uri": f"file://{tempfile.mkdtemp(prefix='agent-replay-')}", "start_batch_manager": False,
        "ingress_deployment_config": {"num_replicas": 2}}


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def session(client: openai.AsyncClient, index: int, turns: int) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each turn."""
    rng = random.Random(index)
    messages = [{"role": "system", "content": f"Session {index}. You are a coding agent. " + text(rng, 300)},
                {"role": "user", "content": "Fix the failing test. " + text(rng, 150)}]
    figures = []
    for turn in range(turns):
        call = {"name": "run", "arguments": json.dumps({"cmd": f"pytest -x step{turn}"})}
        reply = await client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=[TOOL], max_tokens=64, temperature=0,
            extra_body={"ebnf": _forced(call)})
        usage = reply.usage
        figures.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
        call_id = f"call_{index}_{turn}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": call}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text(rng, 60)})
    return figures


def _forced(call: dict) -> str:
    """A grammar that makes the model write exactly this tool call, as Qwen2.5 writes one."""
    return "root ::= " + json.dumps(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")


def run(model_dir: Path, router: str, sessions: int, turns: int, kv_cache_mb: int) -> dict:
    import ray
    from ray import serve

    from deployments import build_openai_app

    ray.init(address="local", num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app(app_args(model_dir, ROUTERS[router], kv_cache_mb)), route_prefix="/")
    try:
        async def main():
            async with openai.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                          timeout=600) as client:
                return await asyncio.gather(*(session(client, i, turns) for i in range(sessions)))

        start = time.monotonic()
        per_session = asyncio.run(main())
        seconds = time.monotonic() - start
    finally:
        serve.shutdown()
        ray.shutdown()
    prompt = sum(p for figures in per_session for p, _ in figures)
    cached = sum(c for figures in per_session for _, c in figures)
    later = [(p, c) for figures in per_session for p, c in figures[1:]]  # turns that could reuse a prefix
    result = {"router": router, "sessions": sessions, "turns": turns, "kv_cache_mb": kv_cache_mb,
              "last_prompt_tokens": max(figures[-1][0] for figures in per_session),
              "cached_share": round(cached / prompt, 3),
              "cached_share_after_first_turn": round(sum(c for _, c in later) / sum(p for p, _ in later), 3),
              "turns_under_half_cached": sum(c < p / 2 for p, c in later), "seconds": round(seconds, 1)}
    report("agent_replay", **result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--kv-cache-mb", type=int, default=256, help="each replica's KV cache (the default holds "
                        "every session; a smaller one makes the replicas evict)")
    parser.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS))
    args = parser.parse_args()
    model_dir = build_model_dir(Path(tempfile.mkdtemp(prefix="agent-model-")), "qwen2", max_positions=16384)
    for sessions in args.sessions:
        for router in args.routers:
            run(model_dir, router, sessions, args.turns, args.kv_cache_mb)


if __name__ == "__main__":
    main()
