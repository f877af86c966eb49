"""LoRA adapters named by requests: `model: "<model_id>:<adapter>"`.

An adapter's PEFT files live under the model's `lora_config.dynamic_lora_loading_path`
(`file://` or `s3://`, through the same object-store layer as batch files, so
boto3's credential chain applies) and are fetched once per replica into a
local directory, which the engine then reads. Fetching runs on the request's
worker thread, never on the event loop or the engine's thread; S3 calls have
boto3's timeouts and retries. A name that is not there is a 404, as an
unknown model is.
"""

import re
import shutil
import tempfile
import threading
from pathlib import Path

from deployments.app_config import LLMConfig, LoraConfig
from deployments.errors import OpenAIError, model_not_found
from deployments.storage import MissingObjectError, StoreError, open_store
from runtime import LoRARequest

FILES = ("adapter_config.json", "adapter_model.safetensors")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def adapter_name(model: str | None, model_id: str) -> str | None:
    """The adapter a request's `model` names for the model `model_id` (None: the base model itself)."""
    if not isinstance(model, str) or model == model_id or not model.startswith(model_id + ":"):
        return None
    return model[len(model_id) + 1:]


class ModelAdapters:
    """A model's LoRA adapters: none, for a model without `lora_config` (a request naming one then names no
    model we serve); `AdapterSource` for one with it."""

    def __init__(self, model_id: str):
        self.model_id = model_id

    def names(self) -> list[str]:
        return []

    def model_name(self, model: str | None) -> str:
        """What replies name as their model: the model, or `<model_id>:<adapter>` for an adapter's."""
        return model if adapter_name(model, self.model_id) is not None else self.model_id

    def request_for(self, model: str | None) -> None:
        if adapter_name(model, self.model_id) is not None:
            raise model_not_found(model)
        return None


class AdapterSource(ModelAdapters):
    def __init__(self, model_id: str, config: LoraConfig):
        super().__init__(model_id)
        self.store = open_store(config.dynamic_lora_loading_path)
        self._cache: Path | None = None  # made on the first fetch: an ingress only lists adapters
        self._fetching = threading.Lock()

    def names(self) -> list[str]:
        """Every adapter under the loading path (a folder holding an adapter_config.json)."""
        return sorted({key.split("/")[0] for key in self.store.list("") if key.endswith("/" + FILES[0])
                       and key.count("/") == 1 and _NAME.fullmatch(key.split("/")[0])})

    def request_for(self, model: str | None) -> LoRARequest | None:
        """The LoRARequest of the adapter `model` names, its files fetched to local disk (blocking)."""
        name = adapter_name(model, self.model_id)
        if name is None:
            return None
        if not _NAME.fullmatch(name):
            raise model_not_found(model)
        cache = self._cache
        if cache is None or not (cache / name).is_dir():  # fetched before: no wait behind another fetch
            with self._fetching:  # one fetch at a time
                if self._cache is None:
                    self._cache = Path(tempfile.mkdtemp(prefix="lora-adapters-"))
                cache = self._cache
                if not (cache / name).is_dir():
                    self._fetch(name, cache / name, model)
        return LoRARequest(name, str(cache / name))

    def _fetch(self, name: str, local: Path, model: str) -> None:
        staging = Path(tempfile.mkdtemp(dir=self._cache, prefix=".fetch-"))
        try:
            for file in FILES:
                try:
                    (staging / file).write_bytes(self.store.get(f"{name}/{file}"))
                except MissingObjectError:
                    if file == FILES[0]:
                        raise model_not_found(model) from None
                    raise OpenAIError(400, f"LoRA adapter {name!r}: missing {file}", "model") from None
                except StoreError as e:
                    raise OpenAIError(503, f"LoRA adapter {name!r} could not be fetched: {e}") from None
            staging.rename(local)  # whole or not at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)



def adapters_of(config: LLMConfig) -> ModelAdapters:
    return AdapterSource(config.model_id, config.lora_config) if config.lora_config else ModelAdapters(config.model_id)
