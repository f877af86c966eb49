"""Prompt lookup at tensor_parallel_size 2 gives TP=1's greedy tokens; a draft model needs TP=1."""

import gc

import pytest

from runtime import LLM, InvalidInputError, SamplingParams
from testing.model_factory import build_model_dir
from tests.runtime.test_speculative import NGRAM, _tokens, copy_prompts


def test_tp2_with_prompt_lookup_gives_tp1s_greedy_tokens(ray_cluster, tmp_path):
    model = build_model_dir(tmp_path / "copy_model", "qwen2", init_std=0.02)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(model), dtype="float32", max_model_len=512)
    prompts = copy_prompts(plain, 4)
    expected = _tokens(plain, prompts, params)
    del plain  # a TP=1 engine left alive in the process loses the TP=2 engine's worker, speculation or not
    gc.collect()
    llm = LLM(str(model), dtype="float32", max_model_len=512, tensor_parallel_size=2, speculative_config=NGRAM)
    try:
        assert _tokens(llm, prompts, params) == expected
        assert llm.stats()["spec_num_accepted_tokens"] > 0
    finally:
        llm.shutdown()
    with pytest.raises(InvalidInputError, match="one rank"):
        LLM(str(model), tensor_parallel_size=2,
            speculative_config={"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})
