"""Bad options and requests raise errors naming the field; the engine keeps serving."""

import pickle

import pytest

from runtime import LLM, ContextLengthError, EngineConfig, InvalidInputError, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"n": 0}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logprobs": 50}, "logprobs"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, param):
    with pytest.raises(InvalidInputError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and str(e.value).startswith(f"{param}:")


def test_bad_requests_are_rejected_and_others_still_run(qwen2_model):
    llm = LLM(str(qwen2_model), max_model_len=64)
    engine = llm.engine
    engine.add_request("good", [5, 6, 7], GREEDY)
    cases = [
        ([5] * 64, GREEDY, "prompt", "64 tokens"),
        ([5] * 10, SamplingParams(max_tokens=60), "max_tokens", "70 in total"),
        ([], GREEDY, "prompt", "empty"),
        ([5, 10**6], GREEDY, "prompt", "outside the vocabulary"),
        ([5] * 10, SamplingParams(max_tokens=None, min_tokens=55), "min_tokens", "the 54 tokens the context leaves"),
        ([5] * 10, SamplingParams(max_tokens=None, min_tokens=10**30), "min_tokens", "maximum context length is 64"),
    ]
    for prompt, params, param, text in cases:
        with pytest.raises(InvalidInputError) as e:
            engine.add_request(f"bad-{param}", prompt, params)
        assert e.value.param == param and text in str(e.value)
    overflows = [([5] * 64, GREEDY, (64, None, 64)), ([5] * 10, SamplingParams(max_tokens=60), (10, 60, 64))]
    for prompt, params, counts in overflows:  # the counts, also as they cross from an engine process
        with pytest.raises(ContextLengthError) as e:
            engine.add_request("over", prompt, params)
        for error in (e.value, pickle.loads(pickle.dumps(e.value))):
            assert (error.prompt_tokens, error.max_tokens, error.limit) == counts and str(error) == str(e.value)
    with pytest.raises(InvalidInputError, match="already in flight"):
        engine.add_request("good", [1], GREEDY)
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert [d.request_id for d in outputs] == ["good"] * 4 and outputs[-1].finished
    assert llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].finish_reason == "length"


TEXTS = ["hello world", "word " * 300, "é" * 90 + "e\u0301" * 40, "<|im_start|>user\nhi<|im_end|>" * 20,
         "日本語のテキスト" * 30, "🙂" * 50, " " * 500]


def test_a_text_far_over_the_context_is_refused_before_it_is_tokenized(qwen2_model):
    llm = LLM(str(qwen2_model), max_model_len=64)
    bound = llm.engine.validator.token_count_bound
    assert all(0 < bound.fewest_tokens(t) <= len(llm.tokenizer.encode(t)) for t in TEXTS[1:])
    with pytest.raises(InvalidInputError, match="the prompt has at least 357142 tokens") as e:
        llm.generate("word " * 1_000_000, GREEDY)
    assert e.value.param == "prompt"
    with pytest.raises(InvalidInputError, match=r"the prompt has \d+ tokens"):  # under the bound: counted exactly
        llm.generate("word " * 70, GREEDY)
    with pytest.raises(InvalidInputError, match="not valid Unicode: surrogates not allowed at character 1"):
        llm.generate("a\ud800b", GREEDY)


def test_a_tokenizer_that_can_drop_characters_gets_no_bound():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from runtime.text.tokenizer import TokenCountBound

    wordpiece = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1},
                                                                                    unk_token="[UNK]")))
    assert TokenCountBound(wordpiece).fewest_tokens("x" * 10**6) == 0


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"dtype": "int8"}, "dtype"),
        ({"max_model_len": 10**6}, "max_model_len"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"device": "tpu"}, "device"),
        ({"kv_cache_bytes": 1024}, "kv_cache_bytes"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),  # 4 attention heads
        ({"attention_backend": "nope"}, "attention_backend"),
        ({"attention_backend": "triton", "device": "cpu"}, "attention_backend"),
    ],
)
def test_bad_engine_options_name_the_field(qwen2_model, kwargs, param):
    with pytest.raises(InvalidInputError) as e:
        LLM(str(qwen2_model), **kwargs)
    assert e.value.param == param


def test_engine_options_are_checked_without_reading_the_model():
    EngineConfig("no-such-model", max_model_len=64, max_num_seqs=4)  # the model is resolved by the engine
    with pytest.raises(InvalidInputError) as e:
        EngineConfig("no-such-model", max_num_seqs=0)
    assert e.value.param == "max_num_seqs"


def test_unknown_model_path(tmp_path):
    with pytest.raises(InvalidInputError) as e:
        LLM(str(tmp_path / "no-such-model"))
    assert e.value.param == "model" and "no-such-model" in str(e.value)
