"""gpt-oss end to end in harmony: a tiny random gpt-oss with gpt-oss's tokenizer, offline (`LLM.chat`) and served
(the openai SDK). The random model writes no meaningful harmony, so what is checked is the prompt harmony
rendered, the stop tokens, and a reply equal to harmony's parse of its own token ids, streamed or not."""

import openai
import pytest
import requests

from deployments.parsers.harmony import HarmonyParser
from runtime import LLM, SamplingParams
from runtime.text.harmony_chat import render_harmony
from testing.harmony_vocab import build_gpt_oss_dir
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = 200012  # <|call|>


@pytest.fixture(scope="module")
def gpt_oss_dir(harmony_vocab, tmp_path_factory):
    return build_gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"), harmony_vocab / "o200k_base.tiktoken")


@pytest.fixture(scope="module")
def gpt_oss(server, gpt_oss_dir, harmony_vocab, tmp_path_factory):
    """The SDK on an app serving the tiny gpt-oss with no parsers configured: harmony is chosen by the model."""
    args = app_args(gpt_oss_dir, f"file://{tmp_path_factory.mktemp('gpt-oss-storage')}")
    config = args["llm_configs"][0]
    del config["reasoning_parser"], config["tool_call_parser"]
    config["deployment_config"] = {"ray_actor_options": {"runtime_env": {
        "env_vars": {"TIKTOKEN_ENCODINGS_BASE": str(harmony_vocab)}}}}
    with another_app(server, "gpt-oss", args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None"), url


@pytest.fixture(scope="module")
def gpt_oss_client(gpt_oss):
    return gpt_oss[0]


def harmony_parse(token_ids: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    parser = HarmonyParser()
    reasoning, content, calls = parser.feed(token_ids)
    return reasoning, content + parser.finish(), [(c.name, c.arguments) for c in calls]


def test_llm_chat_renders_through_harmony_and_stops_at_a_call(gpt_oss_dir):
    llm = LLM(str(gpt_oss_dir), **ENGINE_KWARGS)
    greedy, call = SamplingParams(max_tokens=4, temperature=0), SamplingParams(
        max_tokens=4, temperature=0, ignore_eos=True, logit_bias={CALL: 100.0})
    outputs = llm.chat([MESSAGES, MESSAGES], [greedy, call], chat_template_kwargs={"reasoning_effort": "low"},
                       tools=[WEATHER_TOOL])
    assert [o.prompt_token_ids for o in outputs] == [render_harmony(MESSAGES, [WEATHER_TOOL], "low")] * 2
    assert len(outputs[0].outputs[0].token_ids) == 4
    assert (outputs[1].outputs[0].token_ids, outputs[1].outputs[0].finish_reason) == ([CALL], "stop")


def test_served_reply_is_harmonys_parse_of_its_tokens_streamed_or_not(gpt_oss_client):
    request = dict(model=MODEL_ID, messages=MESSAGES, tools=[WEATHER_TOOL], max_tokens=12, temperature=0,
                   reasoning_effort="low", extra_body={"return_token_ids": True})
    reply = gpt_oss_client.chat.completions.create(**request).model_dump()
    assert reply["prompt_token_ids"] == render_harmony(MESSAGES, [WEATHER_TOOL], "low")
    choice = reply["choices"][0]
    reasoning, content, calls = harmony_parse(choice["token_ids"])
    message = choice["message"]
    assert (message["reasoning_content"] or "", message["content"] or "") == (reasoning, content)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"] or []] == calls
    assert reply["usage"]["completion_tokens"] == 12
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in gpt_oss_client.chat.completions.create(**request, stream=True):
        for choice_delta in chunk.choices:
            for key in streamed:
                streamed[key] += getattr(choice_delta.delta, key, None) or ""
    assert (streamed["reasoning_content"], streamed["content"]) == (reasoning, content)


def test_served_call_token_ends_the_turn(gpt_oss_client):
    reply = gpt_oss_client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=4, temperature=0,
                                            logit_bias={str(CALL): 100},
                                            extra_body={"ignore_eos": True, "return_token_ids": True})
    assert (reply.choices[0].model_dump()["token_ids"], reply.choices[0].finish_reason) == ([CALL], "stop")


@pytest.mark.parametrize("extra, param", [
    ({"reasoning_effort": "minimal"}, "reasoning_effort"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"extra_body": {"chat_template_kwargs": {"reasoning_effort": "max"}}}, "reasoning_effort"),
])
def test_what_harmony_cannot_do_is_a_400(gpt_oss_client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        gpt_oss_client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2, **extra)
    assert error.value.body["param"] == param


def test_tokenize_gives_the_ids_chat_completions_are_given(gpt_oss):
    _, url = gpt_oss
    reply = requests.post(f"{url}/tokenize", json={"model": MODEL_ID, "messages": MESSAGES, "tools": [WEATHER_TOOL],
                                                   "chat_template_kwargs": {"reasoning_effort": "high"}}).json()
    assert reply["tokens"] == render_harmony(MESSAGES, [WEATHER_TOOL], "high")
