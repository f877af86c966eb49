"""A server's engine warms up before it says ready: the first requests should not pay for what the engine does
once (the attention kernel's first launches at each shape, the allocator growing to a full batch, the sampler's
paths, the tokenizer's first decodes).

It runs a prefill of the largest chunk a step takes, then a decode step at the engine's full batch, sampled
greedily and at temperature 1 with top-p and top-k; then it forgets what they left behind (their cached
blocks, the preemptions they caused), so the engine starts serving as if they had never run.
"""

import logging
import time

from runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_MAX_STEPS = 10_000  # a bound, never reached: the warm-up's requests need a few steps each


def warm_up(engine) -> float:
    """Run the warm-up requests through `engine` (an LLMEngine with nothing in flight); its seconds."""
    start = time.perf_counter()
    config, spec = engine.config, engine.spec
    token = engine.tokenizer.encode("warm", add_special_tokens=False)[:1] or [0]
    kv_tokens = engine.block_manager.num_blocks // 2 * config.block_size  # room left for the short ones
    longest = max(1, min(config.max_num_batched_tokens, spec.max_model_len - 2, kv_tokens))
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=2, ignore_eos=True, seed=0)
    prompts = [token * longest] + [token] * (config.max_num_seqs - 1)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"warm-up-{i}", prompt, greedy if i % 2 else sampled, stream=False)
    for _ in range(_MAX_STEPS):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    for request_id in list(engine.requests):
        engine.abort(request_id)
    engine.block_manager.forget_cached()
    engine.scheduler.num_preemptions = 0
    seconds = time.perf_counter() - start
    logger.info("warm-up: %d requests (a %d-token prefill, a decode at %d sequences) in %.2f s", len(prompts),
                longest, config.max_num_seqs, seconds)
    return seconds
