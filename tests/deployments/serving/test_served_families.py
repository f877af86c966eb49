"""Model families served end to end: DeepSeek-V3's (latent attention, a mixture of experts), Qwen3-Next's
(linear attention beside full attention) and a sliding-window one (a 16-token window on every layer, shorter than
every conversation here) behind the real app, through the `openai` SDK, answering as the offline engine does
(greedy), streamed and whole, with a forced tool call."""

import json

import pytest

from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args
from tests.deployments.api.test_reasoning_and_tools import WEATHER_TOOL
from tests.runtime.test_model_families import FAMILIES, SLIDING

MESSAGES = [{"role": "user", "content": "Tell me about the weather in Paris"}]
SERVED = {"deepseek_v3": FAMILIES["deepseek_v3"], "qwen3_next": {}, "mistral_sliding": SLIDING["mistral_sliding"]}


@pytest.fixture(scope="module", params=list(SERVED))
def family_app(request, server, tmp_path_factory):
    """(SDK client, offline engine) for a tiny checkpoint of the family, served beside the shared app."""
    import openai

    fields = dict(SERVED[request.param])
    model_dir = build_model_dir(tmp_path_factory.mktemp(request.param), fields.pop("arch", request.param), **fields)
    args = app_args(model_dir, f"file://{tmp_path_factory.mktemp(f'{request.param}-storage')}")
    with another_app(server, request.param, args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None"), LLM(str(model_dir), **ENGINE_KWARGS)


def test_chat_whole_and_streamed_equals_the_offline_engine(family_app):
    client, offline = family_app
    expected = offline.chat([MESSAGES], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    whole = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.usage.completion_tokens == 16
    stream = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected.outputs[0].text


def test_a_forced_tool_call_whole_and_streamed(family_app):
    client, _ = family_app
    asked = dict(model=MODEL_ID, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=256,
                 temperature=0)
    (call,) = client.chat.completions.create(**asked).choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert list(arguments) == ["city"] and len(arguments["city"]) <= 12  # the schema, held by the grammar
    streamed = "".join(tc.function.arguments or "" for c in client.chat.completions.create(**asked, stream=True)
                       if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls)
    assert json.loads(streamed) == arguments
