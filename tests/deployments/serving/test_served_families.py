"""Model families served end to end: DeepSeek-V3's (latent attention, a mixture of experts), Qwen3-Next's
(linear attention beside full attention) and a sliding-window one (a 16-token window on every layer, shorter than
every conversation here), three models behind one real app, through the `openai` SDK, each answering as its
offline engine does (greedy), streamed and whole, with a forced tool call."""

import json

import pytest

from runtime import LLM, SamplingParams
from testing.model_factory import build_model_dir
from tests.conftest import ENGINE_KWARGS, another_app, app_args
from tests.deployments.api.test_reasoning_and_tools import WEATHER_TOOL
from tests.runtime.test_model_families import FAMILIES, SLIDING

MESSAGES = [{"role": "user", "content": "Tell me about the weather in Paris"}]
SERVED = {"deepseek_v3": FAMILIES["deepseek_v3"], "qwen3_next": {}, "mistral_sliding": SLIDING["mistral_sliding"]}
ARCHITECTURES = {"deepseek_v3": "DeepseekV3ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
                 "mistral_sliding": "MistralForCausalLM"}


@pytest.fixture(scope="module")
def families_app(server, tmp_path_factory):
    """(SDK client, model directories): one app beside the shared one serving each family's tiny checkpoint under
    the family's name."""
    import openai

    dirs = {}
    for family, fields in SERVED.items():
        fields = dict(fields)
        dirs[family] = build_model_dir(tmp_path_factory.mktemp(family), fields.pop("arch", family), **fields)
    args = app_args(dirs["deepseek_v3"], f"file://{tmp_path_factory.mktemp('families-storage')}")
    args["llm_configs"] = [{**args["llm_configs"][0], "model_loading_config": {"model_id": family,
                                                                              "model_source": str(path)}}
                           for family, path in dirs.items()]
    with another_app(server, "families", args) as url:
        yield openai.Client(base_url=f"{url}/v1", api_key="None"), dirs


@pytest.mark.parametrize("family", list(SERVED))
def test_chat_whole_and_streamed_equals_the_offline_engine(families_app, family):
    client, dirs = families_app
    assert client.models.retrieve(family).architecture == ARCHITECTURES[family]  # the model card names it
    offline = LLM(str(dirs[family]), **ENGINE_KWARGS)
    expected = offline.chat([MESSAGES], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    whole = client.chat.completions.create(model=family, messages=MESSAGES, max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.usage.completion_tokens == 16
    stream = client.chat.completions.create(model=family, messages=MESSAGES, max_tokens=16, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected.outputs[0].text


@pytest.mark.parametrize("family", list(SERVED))
def test_a_forced_tool_call_whole_and_streamed(families_app, family):
    client, _ = families_app
    asked = dict(model=family, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=256,
                 temperature=0)
    (call,) = client.chat.completions.create(**asked).choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert list(arguments) == ["city"] and len(arguments["city"]) <= 12  # the schema, held by the grammar
    streamed = "".join(tc.function.arguments or "" for c in client.chat.completions.create(**asked, stream=True)
                       if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls)
    assert json.loads(streamed) == arguments
