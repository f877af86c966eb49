"""EleutherAI's lm-evaluation-harness (`local-completions`) against the served app, as its users run it, on tasks
read from local JSONL files (no hub): a multiple-choice task scored through echoed prompt logprobs, each
choice's loglikelihood equal to transformers' on the same weights; a generate_until task; rolling perplexity."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import MODEL_ID

QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "Tokyo", "Rome"], "answer": 0},
    {"question": "Question: what is 2 + 2? Answer:", "choices": ["4", "5", "22"], "answer": 0},
    {"question": "Once upon a time, a small robot learned to write", "choices": ["poems", "code"], "answer": 0},
]
TEXTS = [{"text": "The capital of Japan is Tokyo. The capital of Italy is Rome."},
         {"text": "def add(a, b):\n    return a + b\n"}]

TASKS = {
    "tiny_choice": {"output_type": "multiple_choice", "doc_to_text": "{{question}}",
                    "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}],
                    "data": QUESTIONS},
    "tiny_generate": {"output_type": "generate_until", "doc_to_text": "{{question}}",
                      "doc_to_target": "{{choices[answer]}}", "metric_list": [{"metric": "exact_match"}],
                      "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
                      "data": QUESTIONS},
    "tiny_perplexity": {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
                        "metric_list": [{"metric": "word_perplexity"}], "data": TEXTS},
}


@pytest.fixture(scope="module")
def results(server, tmp_path_factory):
    """One lm_eval.simple_evaluate over the three tasks, with every sample logged."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("tasks")
    for name, spec in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in spec["data"]))
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", **{k: v for k, v in spec.items() if k != "data"}}
        (folder / f"{name}.yaml").write_text(json.dumps(task))  # YAML is a superset of JSON
    model_args = (f"model={MODEL_ID},base_url={server.openai_url}/completions,tokenizer_backend=huggingface,"
                  f"tokenizer={server.model_dir},num_concurrent=4,max_retries=1")
    return lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=list(TASKS),
                                   task_manager=TaskManager(include_path=str(folder)), log_samples=True)


def test_choice_loglikelihoods_equal_transformers(server, results):
    tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    samples = results["samples"]["tiny_choice"]
    assert len(samples) == len(QUESTIONS)
    for sample in samples:
        pairs, responses = _arguments(sample), _responses(sample)
        assert len(pairs) == len(responses) == len(sample["doc"]["choices"])
        for (context, continuation), (loglikelihood, _) in zip(pairs, responses):
            assert loglikelihood == pytest.approx(_reference(model, tokenizer, context, continuation), abs=1e-4)
    assert 0.0 <= results["results"]["tiny_choice"]["acc,none"] <= 1.0


def test_generation_and_rolling_perplexity_complete(results):
    assert len(results["samples"]["tiny_generate"]) == len(QUESTIONS)
    assert all(isinstance(s["filtered_resps"][0], str) for s in results["samples"]["tiny_generate"])
    perplexity = results["results"]["tiny_perplexity"]["word_perplexity,none"]
    assert perplexity > 1.0 and perplexity == perplexity  # a number, not NaN


def _arguments(sample) -> list[tuple[str, str]]:
    """(context, continuation) of each request, however this lm-eval release logs them."""
    args = sample["arguments"]
    if isinstance(args, dict):
        return [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]


def _responses(sample) -> list[tuple[float, bool]]:
    return [tuple(r[0]) for r in sample["resps"]]


def _reference(model, tokenizer, context: str, continuation: str) -> float:
    """The continuation's loglikelihood as lm-eval splits the pair (trailing spaces of the context move to the
    continuation; the continuation's tokens are the whole's past the context's), from transformers' logits."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer(context + continuation)["input_ids"]
    start = len(tokenizer(context)["input_ids"])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0], dim=-1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(start, len(whole)))
