"""Prefill/decode disaggregation served (`prefill_config`): a chat, whole and streamed, answers as the offline
engine does; the prefill replica published the prompt's blocks and the decode replica fetched them."""

import uuid

import openai
from ray import serve

from deployments.app_config import replica_name
from runtime import LLM, SamplingParams
from tests.conftest import ENGINE_KWARGS, MODEL_ID, another_app, app_args
from tests.runtime.test_greedy_parity import WORDS


def test_a_disaggregated_chat_answers_as_the_offline_engine(server, tmp_path_factory):
    tier = {"size_gib": 0.05, "name": f"pd-{uuid.uuid4()}", "min_prompt_tokens": 256}
    args = app_args(server.model_dir, f"file://{tmp_path_factory.mktemp('pd')}")
    config = args["llm_configs"][0]
    config["engine_kwargs"] = {**ENGINE_KWARGS, "warm_up": False, "kv_offloading_size": 0.01, "kv_shared_tier": tier}
    config["prefill_config"] = {"deployment_config": {"max_ongoing_requests": 8}}
    messages = [{"role": "user", "content": " ".join(WORDS * 12)}]  # some 300 tokens
    offline = LLM(str(server.model_dir), **ENGINE_KWARGS).chat(messages, SamplingParams(temperature=0, max_tokens=16))
    with another_app(server, "pd", args) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        whole = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=16)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model=MODEL_ID, messages=messages, temperature=0, max_tokens=16, stream=True) if chunk.choices)
        stats = {side: serve.get_deployment_handle(replica_name(MODEL_ID, side), app_name="pd").stats.remote().result()
                 for side in (False, True)}
    assert whole.choices[0].message.content == streamed == offline[0].outputs[0].text
    assert whole.usage.prompt_tokens >= 256 and whole.usage.prompt_tokens_details.cached_tokens >= 256 - 16
    assert stats[True]["kv_shared_published_blocks"] > 0 and stats[False]["kv_shared_fetched_blocks"] > 0
