"""Fill a model from the HF safetensors shards in a directory, one tensor at a time (or from tensors a trainer
sent: `load_tensors`)."""

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from runtime.layers.linear import default_weight_loader


def tensor_names(model: nn.Module, model_dir: Path) -> set[str]:
    """The names of the checkpoint's tensors, as a causal LM's checkpoint names them."""
    names = set()
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f"model.{name}" if model.bare_names else name for name in f.keys())
    return names


def load_weights(model: nn.Module, model_dir: Path, keep: Callable[[str], bool] | None = None) -> None:
    """Load every checkpoint tensor of `model_dir`'s safetensors shards (`load_tensors`), or those whose names
    `keep` keeps (the others are not read)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    load_tensors(model, _checkpoint_tensors(files, keep))


def _checkpoint_tensors(files: list[Path], keep: Callable[[str], bool] | None) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if keep is None or keep(name):
                    yield name, f.get_tensor(name)


def load_tensors(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint tensors (name, tensor) through their parameters' `weight_loader`.

    The model's `param_for` names the parameter each tensor fills and the shard arguments (which of q/k/v or
    gate/up, which expert) its loader takes; a base model's tensor names gain the causal LM's `model.` prefix
    first. Raises if a parameter is left without a checkpoint tensor.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in model.checkpoint_tensors(tensors):
        if "rotary_emb" in name:
            continue
        target, shard = model.param_for(f"model.{name}" if model.bare_names else name)
        if target is None:  # a tensor the family leaves out (DeepSeek's multi-token-prediction layers)
            continue
        if target not in params:
            if model.tie_word_embeddings and target == "lm_head.weight" or not model.holds(target):
                continue  # tied to the embedding, or another pipeline stage's
            raise KeyError(f"checkpoint tensor {name!r} matches no parameter")
        param = params[target]
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, tensor, *shard)
        loaded.add(target)
    if model.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"parameters missing from the checkpoint: {sorted(missing)[:5]}")
