"""A server's engine warms up before serving (runtime.engine.warm_up), then starts as a cold one would."""

import logging

from runtime import LLM, SamplingParams


def test_a_warmed_up_engine_starts_as_a_cold_one_and_generates_the_same_tokens(qwen2_model, caplog):
    options = dict(dtype="float32", max_model_len=256, max_num_seqs=32)
    cold = LLM(str(qwen2_model), **options)
    with caplog.at_level(logging.INFO, logger="runtime.engine.warm_up"):
        warm = LLM(str(qwen2_model), warm_up=True, **options)
    assert any("a 254-token prefill, a decode at 32 sequences" in r.message for r in caplog.records)
    # nothing in flight, every block free, no cache hit or preemption counted
    assert warm.engine.stats() == cold.engine.stats()
    prompts = [[5 + i] * (3 + 9 * i) for i in range(6)]
    for params in (SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                   SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True)):
        assert ([o.outputs[0].token_ids for o in warm.generate(prompts, params)]
                == [o.outputs[0].token_ids for o in cold.generate(prompts, params)])
