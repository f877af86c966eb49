"""Prefill/decode disaggregation (`llm_configs[].prefill_config`): a model served by two deployments, in Ray Serve LLM's
`build_pd_openai_app` shape. A generation request goes first to a prefill replica, which computes its prompt alone
(one token, thrown away) and so publishes the prompt's blocks to the KV tier both deployments share
(runtime.kv_tier.shared), answering once the tier's directory holds them; then to a decode replica, which fetches
those blocks before queueing the request and answers it. Long prefills then run beside other prefills, not between a
decode replica's steps.

A prefill that fails (its replica lost, the tier unreachable) is logged and passed over: the decode replica computes the
prompt itself, and the request is answered all the same. Chat and completions are disaggregated; SGLang's /generate,
embeddings and the rest go to the decode deployment alone; the admin routes (pause, sleep, weight updates, adapters)
reach both."""

import asyncio
import logging
from collections.abc import AsyncIterator

from deployments.clients import ModelClient, RemoteModel

logger = logging.getLogger("ray.serve")

# a prefill request keeps its request's prompt (messages, tools, template options) and asks for one greedy token;
# these go back to their defaults: no logprobs, grammars, stops or stored response
_RESET = ("max_completion_tokens", "best_of", "stream_options", "logprobs", "top_logprobs", "echo", "prompt_logprobs",
          "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "regex", "ebnf", "stop", "stop_regex", "stop_token_ids", "min_tokens", "store", "suffix")
_ONE_TOKEN = {"max_tokens": 1, "n": 1, "stream": False, "temperature": 0}


class DisaggregatedModel:
    """A `ModelClient` over a decode deployment that asks a prefill deployment first."""

    def __init__(self, decode: RemoteModel, prefill: RemoteModel):
        self.decode, self.prefill = decode, prefill

    def __getattr__(self, name: str):  # everything but chat and completions: the decode deployment alone
        return getattr(self.decode, name)

    async def _prefilled(self, method: str, req) -> None:
        fields = type(req).model_fields
        update = {name: fields[name].get_default(call_default_factory=True) for name in _RESET if name in fields}
        one_token = req.model_copy(update={**update, **_ONE_TOKEN})
        try:
            await self.prefill.prefill(one_token, method)
        except Exception as e:  # the decode replica computes the prompt instead
            logger.warning("prefill failed, decoding without it: %r", e)

    async def on_every_replica(self, method: str, *args) -> list:
        """An admin operation on every replica of both deployments (the prefill replicas' weights, pause and sleep
        follow the decode replicas'). A trainer's weight group numbers the prefill replicas' ranks after the
        decode replicas'."""
        prefill_args = args
        if method == "join_weight_group":
            master_address, master_port, rank_offset, world_size, backend = args
            decode_ranks = sum(state["ranks"] for state in await self.decode.on_every_replica("lifecycle_state"))
            prefill_args = (master_address, master_port, rank_offset + decode_ranks, world_size, backend)
        decode, prefill = await asyncio.gather(self.decode.on_every_replica(method, *args),
                                               self.prefill.on_every_replica(method, *prefill_args))
        return decode + prefill

    async def chat(self, req, *args, **kwargs) -> dict:
        await self._prefilled("chat", req)
        return await self.decode.chat(req, *args, **kwargs)

    async def completions(self, req, *args, **kwargs) -> dict:
        await self._prefilled("completions", req)
        return await self.decode.completions(req, *args, **kwargs)

    async def chat_stream(self, req, *args, **kwargs) -> AsyncIterator:
        await self._prefilled("chat", req)
        async for chunk in self.decode.chat_stream(req, *args, **kwargs):
            yield chunk

    async def completions_stream(self, req, *args, **kwargs) -> AsyncIterator:
        await self._prefilled("completions", req)
        async for chunk in self.decode.completions_stream(req, *args, **kwargs):
            yield chunk



def model_clients(replicas: dict, prefill_replicas: dict) -> dict[str, ModelClient]:
    """The ingress's client of each model: its replicas, behind its prefill replicas where it has them."""
    return {model_id: DisaggregatedModel(RemoteModel(handle), RemoteModel(prefill_replicas[model_id]))
            if model_id in prefill_replicas else RemoteModel(handle) for model_id, handle in replicas.items()}
