"""A prompt scored without generating: max_tokens 0 prefills the prompt (its logprobs when asked) and finishes
with nothing sampled, beside requests that generate, with async scheduling too; prompt logprobs at a temperature
are transformers' log_softmax(logits / T)."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime import LLM, InvalidInputError, SamplingParams

PROMPTS = [list(range(5, 45)), [7, 8, 9, 10, 11, 12], list(range(100, 190))]


@pytest.fixture(scope="module")
def reference(qwen2_model):
    return AutoModelForCausalLM.from_pretrained(qwen2_model, dtype=torch.float32)


def _logprobs(output) -> list[float]:
    return [entry.logprob for entry in output.prompt_logprobs[1:]]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_max_tokens_zero_scores_the_prompt_and_samples_nothing(qwen2_model, reference, async_scheduling):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, async_scheduling=async_scheduling)
    scoring = SamplingParams(n=2, max_tokens=0, prompt_logprobs=1)
    generating = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = llm.generate([PROMPTS[1]], generating)[0].outputs[0].token_ids
    scored, generated = llm.generate([PROMPTS[0], PROMPTS[1]], [scoring, generating])
    assert [(o.token_ids, o.text, o.finish_reason) for o in scored.outputs] == [([], "", "length")] * 2
    assert generated.outputs[0].token_ids == alone
    with torch.no_grad():
        ref = torch.log_softmax(reference(torch.tensor([PROMPTS[0]])).logits[0], dim=-1)
    expected = [ref[i - 1, PROMPTS[0][i]].item() for i in range(1, len(PROMPTS[0]))]
    assert scored.prompt_logprobs[0] is None and _logprobs(scored) == pytest.approx(expected, abs=1e-4)
    assert llm.stats()["num_requests"] == 0


def test_prompt_logprobs_temperature_divides_the_logits(qwen2_model, reference):
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256)
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPTS[2]])).logits[0]
    for temperature in (0.25, 3.0):
        out = llm.generate([PROMPTS[2]], SamplingParams(max_tokens=0, prompt_logprobs=0,
                                                        prompt_logprobs_temperature=temperature))[0]
        ref = torch.log_softmax(logits / temperature, dim=-1)
        expected = [ref[i - 1, PROMPTS[2][i]].item() for i in range(1, len(PROMPTS[2]))]
        assert _logprobs(out) == pytest.approx(expected, abs=1e-4)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidInputError, match="prompt_logprobs_temperature"):
            SamplingParams(prompt_logprobs=0, prompt_logprobs_temperature=bad)


def test_a_decode_shaped_step_holding_a_prompt_that_samples_nothing_is_not_graphed(qwen2_model):
    """The last 1-token chunk of a max_tokens 0 prompt beside a decode makes a step of 1-token rows, but not one
    logit row per sequence: a decode graph, which returns a logit row for every sequence, must not run it."""
    llm = LLM(str(qwen2_model), dtype="float32", max_model_len=256, max_num_batched_tokens=4)
    engine, seen = llm.engine, []
    execute = engine.runner.execute
    engine.runner.execute = lambda inputs, *rest: seen.append(inputs) or execute(inputs, *rest)
    engine.add_request("decode", [7, 8, 9], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.add_request("score", [11, 12, 13, 14, 15], SamplingParams(max_tokens=0))
    while engine.has_unfinished_requests():
        engine.step()
    decode_shaped = [s for s in seen if s.num_decodes == len(s.query_lens)]
    assert [(s.query_lens, s.one_sampled_row_each) for s in decode_shaped[:2]] == [([1, 1], False), ([1], True)]


def test_logprobs_of_an_over_sharpened_distribution_are_finite(qwen2_model):
    """A temperature so small that every other token's logprob is -inf (or NaN): each is reported as -9999, as
    vLLM reports it, so the reply stays JSON (which has no infinities)."""
    llm = LLM(str(qwen2_model), max_model_len=256)
    params = SamplingParams(max_tokens=3, temperature=1e-30, logprobs=4, prompt_logprobs=4,
                            prompt_logprobs_temperature=1e-30)
    [out] = llm.generate([[5, 6, 7, 8, 9]], params)
    entries = [e for e in out.prompt_logprobs if e is not None] + out.outputs[0].logprobs
    values = [lp for e in entries for lp in [e.logprob, *(v for _, v in e.top)]]
    assert all(math.isfinite(v) and v >= -9999.0 for v in values) and -9999.0 in values
