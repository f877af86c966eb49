"""The models an app serves, as the HTTP side sees them: a `ModelClient` each, their LoRA adapters, and the
model cards /v1/models lists."""

import asyncio
import math
import time

from deployments.app_config import AppConfig
from deployments.clients import ModelClient
from deployments.errors import OpenAIError, model_not_found
from deployments.replica.adapters import adapter_name, adapters_of

RELIST_S = 1.0  # the least time between two listings of the adapters prompted by unknown model names


class ModelRegistry:
    def __init__(self, config: AppConfig, clients: dict[str, ModelClient]):
        self.clients = clients
        self.sources = {c.model_id: c.model_loading_config.source for c in config.llm_configs}
        self.adapters = {c.model_id: adapters_of(c) for c in config.llm_configs}
        self.lora_paths = {c.model_id: c.lora_config.dynamic_lora_loading_path.rstrip("/")
                           for c in config.llm_configs if c.lora_config}
        self.created = int(time.time())
        self.bare_names: dict[str, str] = {}  # an adapter's bare name -> its model, where just one model has it
        self._listed_at = -math.inf  # when the adapters were last listed for their bare names
        self._max_model_len: dict[str, int] = {}
        self._described: dict[str, dict] = {}  # each model's architecture and quantization, asked once

    def client(self, model: str | None) -> ModelClient:
        return self.clients[self.model_id(model)]

    def model_id(self, model: str | None) -> str:
        """The id of the model a request names (`<model_id>:<adapter>` names the model's LoRA adapter, which its
        replica looks up); the only one served when it names none."""
        if model is None:
            if len(self.clients) == 1:
                return next(iter(self.clients))
            raise OpenAIError(400, f"model: required when serving several models: {sorted(self.clients)}", "model")
        if model in self.clients:
            return model
        base = next((m for m in self.clients if model.startswith(m + ":") and adapter_name(model, m)), None)
        base = base or self.bare_names.get(model)
        if base is None:
            raise model_not_found(model)
        return base

    async def find(self, model: object) -> None:
        """Before a request naming `model` is answered: where it names neither a model nor a known adapter, list
        the adapters again (another ingress may have loaded it; at most once every `RELIST_S`)."""
        if not isinstance(model, str) or model in self.clients or model in self.bare_names or ":" in model \
                or time.monotonic() - self._listed_at < RELIST_S:
            return
        self._listed_at = time.monotonic()
        await self.list_adapters()

    async def list_adapters(self) -> None:
        """Every model's adapters, for their bare names (a name two models' adapters share names neither)."""
        owners: dict[str, list[str]] = {}
        for model_id, source in self.adapters.items():
            for name in await asyncio.to_thread(source.names):
                owners.setdefault(name, []).append(model_id)
        self.bare_names = {name: models[0] for name, models in owners.items()
                           if len(models) == 1 and name not in self.clients}

    def reply_name(self, model: str | None) -> str:
        """The model a reply names: the one the request named (an adapter's reply names the adapter, as the chat
        route's and vLLM's do), else the only one served."""
        return model or self.model_id(None)

    async def max_model_len(self, model_id: str) -> int:
        """A model's context length, asked of a replica once."""
        if model_id not in self._max_model_len:
            self._max_model_len[model_id] = await self.clients[model_id].max_model_len()
        return self._max_model_len[model_id]

    async def card(self, model_id: str) -> dict:
        """OpenAI's model object, with `max_model_len` as vLLM and SGLang give it, the `architecture` the engine
        runs it as, and a quantized checkpoint's `quantization` ("compressed-tensors (w4a16)")."""
        card = {"id": model_id, "object": "model", "created": self.created, "owned_by": "rayllm-engine",
                "root": self.sources[model_id], "max_model_len": await self.max_model_len(model_id)}
        if model_id not in self._described:
            client = self.clients[model_id]
            self._described[model_id] = {"architecture": await client.architecture(),
                                         "quantization": await client.quantization()}
        described = self._described[model_id]
        card["architecture"] = described["architecture"]
        if described["quantization"]:
            card["quantization"] = described["quantization"]
        return card

    async def cards(self) -> list[dict]:
        """Every model, then its LoRA adapters (`<model_id>:<adapter>`, parent the model)."""
        cards = []
        for model_id in self.clients:
            card = await self.card(model_id)
            names = await asyncio.to_thread(self.adapters[model_id].names)
            cards += [card] + [{**card, "id": f"{model_id}:{name}", "parent": model_id,
                                "root": f"{self.lora_paths[model_id]}/{name}"} for name in names]
        return cards
