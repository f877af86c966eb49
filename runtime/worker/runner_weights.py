"""The model runner's weights and memory, for the engine's lifecycle (runtime.engine.lifecycle): new weights from
a checkpoint or from a trainer's process group, sleep (weights and KV cache released) and wake up. On rank 0 of a
replica of several ranks each call first has the other ranks make it too."""

import gc
from pathlib import Path

import torch

from runtime.distributed import broadcast_from_rank0
from runtime.errors import InvalidInputError
from runtime.worker.model_builder import build_model, check_shapes, checkpoint_shapes
from runtime.worker.step import RunnerCall
from runtime.worker.weight_transfer import WeightGroup


def attention_layers(model) -> list:
    """The layers that hold the paged KV cache (a hybrid model's linear-attention layers keep a state per sequence's
    slot instead)."""
    return [a for a in (getattr(layer, "self_attn", None) for layer in model.model.layers) if a is not None]


class RunnerWeights:
    """Mixed into ModelRunner (its spec, config, device, model, caches and `_attach_caches`)."""

    weights: Path  # the checkpoint the weights were last loaded from: waking up loads it again
    weight_group: WeightGroup | None = None

    def load_weights_from(self, path: Path) -> None:
        """Rebuild the model from another checkpoint of the same architecture and shapes; the KV cache stays (the
        engine has sent every sequence back to recompute)."""
        check_shapes(checkpoint_shapes(self.weights), checkpoint_shapes(path), str(path), "model_path")
        self._on_every_rank("load_weights_from", path)
        self._rebuild(path)
        self.weights = path

    def join_weight_group(self, address: str, port: int, rank_offset: int, world_size: int, backend: str) -> None:
        """Join a trainer's weight-transfer group (runtime.worker.weight_transfer) as `rank_offset` plus this rank."""
        self._on_every_rank("join_weight_group", address, port, rank_offset, world_size, backend)
        self.weight_group = WeightGroup.join(address, port, rank_offset + self.rank, world_size, backend, self.device)

    def load_weights_from_group(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> None:
        """Receive every checkpoint tensor, in this order, from the trainer's group, and rebuild the model on them.
        Waking up later loads the last checkpoint from disk again."""
        if self.weight_group is None:
            raise InvalidInputError("names", "no weight update group: init_weights_update_group first")
        if self.spec.quantization is not None:
            raise InvalidInputError("names", "weights from a trainer replace a bf16/fp32 checkpoint's, not a "
                                    "quantized one's")
        check_shapes(checkpoint_shapes(self.weights), dict(zip(names, map(tuple, shapes))), "the update", "names")
        try:
            types = [getattr(torch, dtype) for dtype in dtypes]
        except AttributeError as e:
            raise InvalidInputError("dtypes", f"not a torch dtype: {e}") from None
        self._on_every_rank("load_weights_from_group", names, dtypes, shapes)
        self._rebuild(self.weights, list(zip(names, self.weight_group.receive(types, shapes))))

    def sleep(self) -> None:
        """Release the weights and the KV cache; `wake_up` builds them again (the weights from their checkpoint)."""
        self._on_every_rank("sleep")
        self._drop_model()
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        self._on_every_rank("wake_up")
        self.model, self.lora_batch = build_model(self.spec, self.config, self.device, self.weights)
        self.attention_layers = attention_layers(self.model)
        self.kv_cache = self.new_kv_cache(self.num_blocks)
        self._attach_caches()

    @property
    def kv_cache_bytes(self) -> int:
        """The KV cache's size now: 0 while asleep."""
        return 0 if self.kv_cache is None else self.kv_cache.numel() * self.kv_cache.element_size()

    def _rebuild(self, path: Path, tensors: list | None = None) -> None:
        """The model built anew (the old one let go first); if that fails, from the current weights again."""
        self._drop_model()
        try:
            self.model, self.lora_batch = build_model(self.spec, self.config, self.device, path, tensors)
        except BaseException:
            self.model, self.lora_batch = build_model(self.spec, self.config, self.device, self.weights)
            self._attach_caches()
            raise
        self._attach_caches()

    def _drop_model(self) -> None:
        self.model = self.lora_batch = self.graphs = self.hidden = None
        self.attention_layers, self.stateful_layers = [], []
        gc.collect()

    def _on_every_rank(self, name: str, *args) -> None:
        """On rank 0 of several ranks: have the other ranks call `name` too."""
        if self.rank == 0 and self.config.world_size > 1:
            broadcast_from_rank0(RunnerCall(name, args))
