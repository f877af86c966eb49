"""Cost of structured outputs: output tokens/s at 32 concurrent requests with a JSON-schema
constraint vs unconstrained, same engine, same prompts, on the CPU benchmark model.

Run: python -m benchmarks.structured_output
"""

import asyncio
import json

from benchmarks.common import build_cpu_model, generate_concurrently, report, shared_prefix_prompts
from runtime import AsyncLLMEngine, SamplingParams
from runtime.text.grammar import Constraint

CONCURRENCY, REQUESTS, OUTPUT = 32, 64, 128
SCHEMA = {  # long enough that every request is still inside the JSON after OUTPUT tokens
    "type": "array", "minItems": 50, "maxItems": 50,
    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "score"], "additionalProperties": False},
}


def main() -> None:
    path = build_cpu_model()
    engine = AsyncLLMEngine.from_options(str(path), max_model_len=1024)
    prompts = shared_prefix_prompts(REQUESTS, 250, 30)
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    plain = lambda i: SamplingParams(temperature=1.0, seed=i, max_tokens=OUTPUT, ignore_eos=True)  # noqa: E731
    constrained = lambda i: SamplingParams(temperature=1.0, seed=i, max_tokens=OUTPUT,  # noqa: E731
                                           structured_output=constraint)

    def run(count: int, params_for) -> tuple[float, int]:
        requests = [(prompt, params_for(i)) for i, prompt in enumerate(prompts[:count])]
        return asyncio.run(generate_concurrently(engine, requests, CONCURRENCY))

    run(4, constrained)  # warm-up, and the grammar is compiled once
    free_s, free_tokens = run(REQUESTS, plain)
    json_s, json_tokens = run(REQUESTS, constrained)
    engine.shutdown()
    report("structured_output", concurrency=CONCURRENCY, requests=REQUESTS,
           unconstrained_tok_s=round(free_tokens / free_s, 1), json_schema_tok_s=round(json_tokens / json_s, 1),
           json_tokens=json_tokens, unconstrained_tokens=free_tokens,
           constrained_over_unconstrained=round((json_tokens / json_s) / (free_tokens / free_s), 3))


if __name__ == "__main__":
    main()
