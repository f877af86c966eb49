"""LoRA adapters named by requests: `model: "<model_id>:<adapter>"`, or the adapter's bare name where no other
model and no other model's adapter has it (vLLM's way: `model: "<adapter>"`).

An adapter's PEFT files live under the model's `lora_config.dynamic_lora_loading_path` (by default the app's
storage, under `lora-adapters/<model_id>/`)
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
    """The adapter a request's `model` names for the model `model_id`: `<model_id>:<adapter>`, or the adapter's bare
    name, as vLLM's clients name it (the ingress sends a replica only names of its model's adapters:
    `ModelRegistry.model_id`); None: the base model itself."""
    if not isinstance(model, str) or model == model_id:
        return None
    if model.startswith(model_id + ":"):
        return model[len(model_id) + 1:]
    return model if ":" not in model else None


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

    def stage(self, name: str, source: str) -> None:
        """vLLM's /v1/load_lora_adapter: copy the adapter at `source` (a directory on this node, or a `file://` or
        `s3://` URI) under the loading path as `name`, where every replica finds it. 400 for a bad name or source,
        or a name already there."""
        if not _NAME.fullmatch(name):
            raise OpenAIError(400, f"lora_name: {name!r} is not a valid adapter name (letters, digits, '.', '_', '-')",
                              "lora_name")
        if self.store.size(f"{name}/{FILES[0]}") is not None:
            raise OpenAIError(400, f"lora_name: the adapter {name!r} is already loaded; unload it first", "lora_name")
        try:
            files = {file: _read_source(source, file) for file in FILES}
        except (OSError, StoreError) as e:
            raise OpenAIError(400, f"lora_path: no PEFT adapter at {source!r} ({e})", "lora_path") from None
        self.store.put(f"{name}/{FILES[1]}", files[FILES[1]])
        self.store.put(f"{name}/{FILES[0]}", files[FILES[0]])  # last: an adapter is listed once whole

    def remove(self, name: str) -> None:
        """vLLM's /v1/unload_lora_adapter: delete the adapter from the loading path; 404 when it is not there."""
        if not _NAME.fullmatch(name) or self.store.size(f"{name}/{FILES[0]}") is None:
            raise OpenAIError(404, f"lora_name: no adapter {name!r} is loaded", "lora_name", "model_not_found")
        self.store.delete_many([f"{name}/{file}" for file in FILES])

    def forget(self, name: str) -> None:
        """Drop this replica's fetched copy of `name` (unloaded: a later adapter of that name is fetched anew)."""
        with self._fetching:
            if self._cache is not None:
                shutil.rmtree(self._cache / name, ignore_errors=True)

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



def _read_source(source: str, file: str) -> bytes:
    if "://" in source:
        return open_store(source).get(file)
    return (Path(source) / file).read_bytes()


def adapters_of(config: LLMConfig) -> ModelAdapters:
    return AdapterSource(config.model_id, config.lora_config) if config.lora_config else ModelAdapters(config.model_id)
