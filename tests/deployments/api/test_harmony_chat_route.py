"""The chat route's replies for gpt-oss, over an engine that writes a scripted harmony output one token a step:
reasoning, a tool call and the finish reason, whole and streamed, as OpenAI's chat completions carry them."""

import asyncio

import pytest

from deployments.api.chat.protocol import ChatCompletionRequest
from deployments.replica.handlers.chat import ChatHandler
from runtime import RequestDelta, SequenceDelta, ValidRequest
from runtime.text.harmony_chat import harmony_encoding, render_harmony

pytestmark = pytest.mark.usefixtures("harmony_vocab")

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
          '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
          '{"city": "Paris"}<|call|>')


class ScriptedEngine:
    """Stands in for AsyncLLMEngine serving gpt-oss: every request gets the script, one token a step."""

    harmony = True
    tokenizer = None

    def __init__(self, script: list[int]):
        self.script = script
        self.prompts: list[list[int]] = []

    def validate(self, prompt, params, lora, images=()) -> ValidRequest:
        self.prompts.append(prompt)
        return ValidRequest(prompt, params, params.max_tokens)

    async def compile(self, request: ValidRequest) -> ValidRequest:
        return request

    async def generate(self, request: ValidRequest, request_id: str, priority: int = 0, owner=None, stream=True):
        for i, token in enumerate(self.script):
            last = i == len(self.script) - 1
            seq = SequenceDelta(0, [token], "", None, "stop" if last else None, token if last else None, i + 1)
            yield RequestDelta(request_id, len(request.prompt_token_ids), 0, [seq], last)


class OneModel:
    def request_for(self, model):
        return None

    def model_name(self, model):
        return model


@pytest.fixture
def handler():
    return ChatHandler(ScriptedEngine(harmony_encoding().encode(SCRIPT, allowed_special="all")), "gpt-oss", None,
                       OneModel())


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="gpt-oss", messages=MESSAGES, tools=[WEATHER_TOOL], reasoning_effort="high",
                                 **fields)


def test_reply_has_reasoning_and_the_tool_call(handler):
    reply = asyncio.run(handler.complete(request(), "chatcmpl-1"))
    assert handler.engine.prompts == [render_harmony(MESSAGES, [WEATHER_TOOL], "high")]
    (choice,) = reply["choices"]
    call = choice["message"].pop("tool_calls")
    assert [(c["type"], c["function"]) for c in call] == [
        ("function", {"name": "get_weather", "arguments": '{"city": "Paris"}'})]
    assert choice["message"] == {"role": "assistant", "content": None, "refusal": None,
                                 "reasoning_content": "Need the weather."}
    assert choice["finish_reason"] == "tool_calls"
    thought = len(harmony_encoding().encode("<|channel|>analysis<|message|>Need the weather.<|end|>",
                                            allowed_special="all"))
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": thought}


def test_stream_sends_reasoning_as_it_comes_and_the_call_whole(handler):
    async def chunks():
        return [c async for c in await handler.stream(request(), "chatcmpl-2")]

    deltas = [c["choices"][0] for c in asyncio.run(chunks())]
    reasoning = [d["delta"]["reasoning_content"] for d in deltas if d["delta"].get("reasoning_content")]
    assert reasoning == ["Need", " the", " weather", "."]
    calls = [d["delta"]["tool_calls"] for d in deltas if d["delta"].get("tool_calls")]
    assert [[(c["index"], c["function"]) for c in call] for call in calls] == [
        [(0, {"name": "get_weather", "arguments": '{"city": "Paris"}'})]]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["tool_calls"]
