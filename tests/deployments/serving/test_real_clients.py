"""Other people's clients against the served app: LangChain (chat completions and the Responses API), LiteLLM and
the OpenAI Agents SDK's default (Responses) model. What they send must be accepted and what we return must parse
into their types; where the random model's words do not matter, a grammar (our `ebnf` extension, sent through
each client's extra-body option) makes it write a known reply."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches a price list on import otherwise

import asyncio  # noqa: E402
import json  # noqa: E402
from typing import Literal  # noqa: E402

import pytest  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from tests.conftest import MODEL_ID  # noqa: E402
from tests.deployments.api.test_reasoning_and_tools import CALL, forced  # noqa: E402


def get_weather(city: str) -> str:
    """Weather in a city."""
    return f"sunny in {city}"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


@pytest.fixture(params=[False, True], ids=["chat", "responses"])
def langchain_chat(server, request):
    from langchain_openai import ChatOpenAI

    def make(**kwargs):
        return ChatOpenAI(model=MODEL_ID, base_url=server.openai_url, api_key="none", max_retries=0,
                          use_responses_api=request.param, **kwargs)

    return make


def test_langchain_invoke_stream_and_multi_turn(langchain_chat):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    llm = langchain_chat(max_tokens=5, temperature=0)
    first = llm.invoke([SystemMessage("Be brief."), HumanMessage("hi")])
    assert isinstance(first, AIMessage) and first.text and first.usage_metadata["output_tokens"] == 5
    streamed = list(llm.stream([SystemMessage("Be brief."), HumanMessage("hi")]))
    assert "".join(chunk.text for chunk in streamed) == first.text
    second = llm.invoke([SystemMessage("Be brief."), HumanMessage("hi"), first, HumanMessage("and then?")])
    assert second.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"] + 3


def test_langchain_bind_tools_and_tool_results(langchain_chat):
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_chat(max_tokens=200, extra_body=forced(CALL)).bind_tools([get_weather])
    reply = llm.invoke([HumanMessage("Weather in Paris?")])
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    followed = langchain_chat(max_tokens=3, temperature=0).bind_tools([get_weather]).invoke(
        [HumanMessage("Weather in Paris?"), reply, ToolMessage(get_weather("Paris"), tool_call_id=call["id"])])
    assert followed.usage_metadata["input_tokens"] > reply.usage_metadata["input_tokens"]


def test_langchain_with_structured_output(langchain_chat):
    llm = langchain_chat(max_tokens=40, temperature=1, extra_body={"seed": 1})
    verdict = llm.with_structured_output(Verdict).invoke("ok?")
    assert isinstance(verdict, Verdict)


def test_litellm_completion_stream_and_tools(server):
    import litellm

    common = dict(model=f"openai/{MODEL_ID}", api_base=server.openai_url, api_key="none")
    messages = [{"role": "user", "content": "hi"}]
    reply = litellm.completion(messages=messages, max_tokens=4, temperature=0, **common)
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 4
    chunks = list(litellm.completion(messages=messages, max_tokens=4, temperature=0, stream=True, **common))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    called = litellm.completion(messages=messages, tools=[tool], max_tokens=200, extra_body=forced(CALL), **common)
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_openai_agents_default_model_runs_an_agent_with_a_tool(server):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model=MODEL_ID, openai_client=AsyncOpenAI(base_url=server.openai_url, api_key="x"))
    talker = Agent(name="talker", instructions="Be brief.", model=model,
                   model_settings=ModelSettings(max_tokens=4, temperature=0))
    result = Runner.run_sync(talker, "hi")
    assert isinstance(result.final_output, str) and result.final_output

    caller = Agent(name="caller", instructions="Use tools.", model=model, tools=[function_tool(get_weather)],
                   tool_use_behavior="stop_on_first_tool",
                   model_settings=ModelSettings(max_tokens=200, extra_body=forced(CALL)))
    assert Runner.run_sync(caller, "Weather in Paris?").final_output == "sunny in Paris"

    async def streamed_run():
        run = Runner.run_streamed(talker, "hi")
        return run, [event async for event in run.stream_events()]

    run, events = asyncio.run(streamed_run())
    assert any(e.type == "raw_response_event" for e in events) and run.final_output == result.final_output


def test_langchain_chat_anthropic_invoke_stream_and_tools(server):
    """LangChain's ChatAnthropic on /v1/messages: the reply, its stream, usage, and a bound tool's call."""
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    def chat(**kwargs):
        return ChatAnthropic(model=MODEL_ID, base_url=server.base_url, api_key="none", max_retries=0, **kwargs)

    conversation = [SystemMessage("Be brief."), HumanMessage("hi")]
    reply = chat(max_tokens=5, temperature=0, model_kwargs={"extra_body": {"ignore_eos": True}}).invoke(conversation)
    assert isinstance(reply, AIMessage) and reply.text and reply.response_metadata["stop_reason"] == "max_tokens"
    assert reply.usage_metadata["output_tokens"] == 5 and reply.usage_metadata["input_tokens"] > 5
    streamed = list(chat(max_tokens=5, temperature=0, streaming=True,
                         model_kwargs={"extra_body": {"ignore_eos": True}}).stream(conversation))
    assert "".join(chunk.text for chunk in streamed) == reply.text
    whole = sum(streamed[1:], streamed[0])
    assert whole.usage_metadata["output_tokens"] == 5
    assert whole.usage_metadata["input_tokens"] == reply.usage_metadata["input_tokens"]

    called = chat(max_tokens=200, model_kwargs={"extra_body": forced(CALL)}).bind_tools([get_weather]).invoke(
        [HumanMessage("Weather in Paris?")])
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
