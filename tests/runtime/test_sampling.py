"""The sampler: seeded determinism independent of the batch, each option's effect and the distribution it
samples, logprobs."""

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from runtime import LLM, SamplingParams
from runtime.core.sequence import Request
from runtime.worker.sampler import Sampler


def _llm(path):
    return LLM(str(path), dtype="float32", max_model_len=256)


def test_seeded_sampling_is_independent_of_the_batch(qwen2_model):
    llm = _llm(qwen2_model)
    prompt = llm.tokenizer.encode("Once upon a time")
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=None) for _ in range(15)]
    batch = llm.generate([prompt] + [llm.tokenizer.encode(f"other prompt {i}") for i in range(15)], [params] + others)
    assert batch[0].outputs[0].token_ids == alone
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == alone
    different = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=99, max_tokens=24, ignore_eos=True)
    assert llm.generate([prompt], different)[0].outputs[0].token_ids != alone


def test_top_k_one_and_tiny_top_p_are_greedy(qwen2_model):
    llm = _llm(qwen2_model)
    prompt = llm.tokenizer.encode("The capital of France")
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    for params in (SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True),
                   SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=16, ignore_eos=True),
                   SamplingParams(temperature=1.5, min_p=1.0, max_tokens=16, ignore_eos=True)):
        assert llm.generate([prompt], params)[0].outputs[0].token_ids == greedy.outputs[0].token_ids


def test_logit_bias_forces_a_token(qwen2_model):
    llm = _llm(qwen2_model)
    out = llm.generate(["hi"], SamplingParams(temperature=0.7, logit_bias={77: 100.0}, max_tokens=6, ignore_eos=True))
    assert out[0].outputs[0].token_ids == [77] * 6


def test_min_tokens_masks_stop_tokens_and_stop_token_ids_end(qwen2_model):
    llm = _llm(qwen2_model)
    eos = llm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    forced_eos = {eos: 100.0}
    out = llm.generate(["hi"], SamplingParams(temperature=0, logit_bias=forced_eos, min_tokens=5, max_tokens=20))[0]
    tokens = out.outputs[0].token_ids
    assert len(tokens) == 6 and tokens[-1] == eos and eos not in tokens[:5]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].matched_stop == eos
    out = llm.generate(["hi"], SamplingParams(temperature=0, logit_bias={9: 100.0}, stop_token_ids=[9], max_tokens=20))
    assert out[0].outputs[0].token_ids == [9] and out[0].outputs[0].matched_stop == 9
    out = llm.generate(["hi"], SamplingParams(temperature=0, logit_bias=forced_eos, ignore_eos=True, max_tokens=7))
    assert out[0].outputs[0].token_ids == [eos] * 7 and out[0].outputs[0].finish_reason == "length"


def _sequence(params: SamplingParams, prompt: list[int], output: list[int]):
    seq = Request("r", prompt, params, 0).seqs[0]
    seq.token_ids.extend(output)
    return seq


def test_penalties_apply_in_one_batched_pass():
    logits = torch.zeros(4, 10)
    logits[:, 5], logits[:, 6] = 1.0, 0.5  # token 5 leads by 0.5, and was already generated twice
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, frequency_penalty=0.3),  # 1 - 2 * 0.3 = 0.4 < 0.5
        SamplingParams(temperature=0, presence_penalty=0.6),  # 1 - 0.6 = 0.4
        SamplingParams(temperature=0, repetition_penalty=2.5),  # 1 / 2.5 = 0.4
    ]
    seqs = [_sequence(p, [1, 2], [5, 5]) for p in params]
    tokens, _ = Sampler(eos_token_ids={0}, device=torch.device("cpu"))(logits, seqs)
    assert tokens == [5, 6, 6, 6]
    # repetition penalty also covers prompt tokens, and multiplies negative logits
    logits = torch.full((1, 10), -1.0)
    logits[0, 1], logits[0, 3] = -0.2, -0.5
    seq = _sequence(SamplingParams(temperature=0, repetition_penalty=3.0), [1, 2], [])
    assert Sampler({0}, torch.device("cpu"))(logits, [seq])[0] == [3]  # -0.2 * 3 = -0.6 < -0.5


def test_logprobs_equal_transformers_log_softmax(qwen2_model):
    llm = _llm(qwen2_model)
    prompt = llm.tokenizer.encode("Question: what is 2 + 2?")
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=10, logprobs=5, prompt_logprobs=3, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    tokens = out.outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(qwen2_model, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0], dim=-1)
    n = len(prompt)
    for i, lp in enumerate(out.outputs[0].logprobs):
        row = ref[n - 1 + i]
        assert lp.token_id == tokens[i]
        assert abs(lp.logprob - row[tokens[i]].item()) < 1e-4
        assert lp.rank == int((row > row[tokens[i]]).sum()) + 1
        top_ids = row.topk(5).indices.tolist()
        assert [t for t, _ in lp.top] == top_ids
        assert all(abs(v - row[t].item()) < 1e-4 for t, v in lp.top)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == n
    for i in range(1, n):
        assert abs(out.prompt_logprobs[i].logprob - ref[i - 1, prompt[i]].item()) < 1e-4
        assert len(out.prompt_logprobs[i].top) == 3


def test_values_that_used_to_stop_the_engine_are_refused_or_handled_and_the_engine_steps_on(qwen2_model):
    """Out-of-vocabulary logit_bias / stop_token_ids ids are a 400-style InvalidInputError at the edge;
    int64-extreme seeds (with n > 1, whose seed + index overflows) and a top_k far above the vocabulary sample
    normally; a seed outside int64 is refused. After each, a greedy request still completes."""
    import pytest

    from runtime.errors import InvalidInputError

    llm = _llm(qwen2_model)
    vocab = llm.engine.spec.vocab_size
    refused = [
        dict(logit_bias={vocab: 5.0}), dict(logit_bias={-1: 5.0}), dict(logit_bias={2**62: 1.0}),
        dict(stop_token_ids=[vocab + 7], min_tokens=2), dict(stop_token_ids=[-3]),
    ]
    for bad in refused:
        with pytest.raises(InvalidInputError):
            llm.generate(["hi"], SamplingParams(temperature=1.0, max_tokens=4, **bad))
    for seed in (-(2**63) - 1, 2**63):
        with pytest.raises(InvalidInputError):
            SamplingParams(seed=seed)
    handled = [dict(seed=2**63 - 1, n=2), dict(seed=-(2**63), n=3), dict(top_k=2**63)]
    for ok in handled:
        out = llm.generate(["hi"], SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, **ok))[0]
        assert [len(c.token_ids) for c in out.outputs] == [4] * ok.get("n", 1)
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert len(llm.generate(["hi"], greedy)[0].outputs[0].token_ids) == 3
    assert llm.engine.stats()["num_free_blocks"] == llm.engine.stats()["num_blocks"]


@pytest.mark.parametrize("fields", [dict(temperature=0.7), dict(temperature=1.3, top_k=5),
                                    dict(temperature=1.0, top_p=0.6), dict(temperature=1.0, min_p=0.3),
                                    dict(temperature=0.8, top_k=8, top_p=0.9, seed=11),
                                    dict(temperature=3.0, top_k=39, top_p=0.999), dict(temperature=2.0, top_p=0.3),
                                    dict(temperature=5.0, top_k=3, min_p=0.5, seed=3)])
def test_sampled_tokens_follow_the_processed_distribution(fields):
    """20,000 draws from one row of logits: only tokens the options keep, at the frequencies softmax gives the kept
    ones (a chi-square test at a fixed seed), whether rows draw from the batch's generator or each from its own
    (a seed per row)."""
    torch.manual_seed(0)
    logits = torch.randn(40) * 2
    params = SamplingParams(max_tokens=1, **fields)
    probs = torch.softmax(logits / params.temperature, dim=-1).double()
    order = probs.argsort(descending=True).tolist()
    top_k_mass = probs[order[: params.top_k if params.top_k > 0 else 40]].sum().item()  # top-p renormalises over it
    keep = torch.zeros(40, dtype=torch.bool)
    mass = 0.0
    for rank, token in enumerate(order):  # from the most likely token down
        if (params.top_k > 0 and rank >= params.top_k) or mass >= params.top_p:
            break
        keep[token] = probs[token] >= params.min_p * probs.max()
        mass += probs[token].item() / top_k_mass
    draws = 20_000
    seeds = [None if params.seed is None else params.seed + i for i in range(draws)]
    rows = [_sequence(SamplingParams(max_tokens=1, **{**fields, "seed": seed}), [1, 2], []) for seed in seeds]
    tokens, _ = Sampler({0}, torch.device("cpu"))(logits.expand(draws, 40).clone(), rows)
    counts = torch.bincount(torch.tensor(tokens), minlength=40).double()
    assert not counts[~keep].any()
    expected = probs[keep] / probs[keep].sum() * draws
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3
