"""Cost of structured outputs: output tokens/s at 32 concurrent requests with a JSON-schema
constraint vs unconstrained, same engine, same prompts, on DESIGN.md's CPU benchmark model.

Run: python -m benchmarks.structured_output
"""

import asyncio
import json
import time

from benchmarks.common import build_cpu_model, report, shared_prefix_prompts
from runtime import AsyncLLMEngine, SamplingParams
from runtime.text.grammar import Constraint

CONCURRENCY, REQUESTS, OUTPUT = 32, 64, 128
SCHEMA = {  # long enough that every request is still inside the JSON after OUTPUT tokens
    "type": "array", "minItems": 50, "maxItems": 50,
    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "score"], "additionalProperties": False},
}


async def run(engine: AsyncLLMEngine, prompts, params_for) -> tuple[float, int]:
    limit = asyncio.Semaphore(CONCURRENCY)
    tokens = 0

    async def one(i, prompt):
        nonlocal tokens
        async with limit:
            async for delta in engine.generate(engine.validate(prompt, params_for(i))):
                tokens += len(delta.seqs[0].token_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return time.perf_counter() - start, tokens


def main() -> None:
    path = build_cpu_model()
    engine = AsyncLLMEngine.from_options(str(path), max_model_len=1024)
    prompts = shared_prefix_prompts(REQUESTS, 250, 30)
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    plain = lambda i: SamplingParams(temperature=1.0, seed=i, max_tokens=OUTPUT, ignore_eos=True)  # noqa: E731
    constrained = lambda i: SamplingParams(temperature=1.0, seed=i, max_tokens=OUTPUT,  # noqa: E731
                                           structured_output=constraint)
    asyncio.run(run(engine, prompts[:4], constrained))  # warm-up, and the grammar is compiled once
    free_s, free_tokens = asyncio.run(run(engine, prompts, plain))
    json_s, json_tokens = asyncio.run(run(engine, prompts, constrained))
    engine.shutdown()
    report("structured_output", concurrency=CONCURRENCY, requests=REQUESTS,
           unconstrained_tok_s=round(free_tokens / free_s, 1), json_schema_tok_s=round(json_tokens / json_s, 1),
           json_tokens=json_tokens, unconstrained_tokens=free_tokens,
           constrained_over_unconstrained=round((json_tokens / json_s) / (free_tokens / free_s), 3))


if __name__ == "__main__":
    main()
