"""Fill a model from the HF safetensors shards in a directory, one tensor at a time."""

from pathlib import Path

from safetensors import safe_open
from torch import nn

from runtime.models.layers import default_weight_loader


def load_weights(model: nn.Module, model_dir: Path) -> None:
    """Load every checkpoint tensor through its parameter's `weight_loader`.

    Projections the model fuses (q/k/v, gate/up) go to the fused parameter with
    a shard id. Raises if a parameter is left without a checkpoint tensor.
    """
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if "rotary_emb" in name:
                    continue
                target, shard = _target(model, name)
                if target not in params:
                    if model.tie_word_embeddings and target == "lm_head.weight":
                        continue
                    raise KeyError(f"checkpoint tensor {name!r} matches no parameter")
                param = params[target]
                loader = getattr(param, "weight_loader", default_weight_loader)
                tensor = f.get_tensor(name)
                loader(param, tensor) if shard is None else loader(param, tensor, shard)
                loaded.add(target)
    if model.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"parameters missing from the checkpoint: {sorted(missing)[:5]}")


def _target(model: nn.Module, name: str) -> tuple[str, object]:
    for part, (fused, shard) in model.stacked_params.items():
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{fused}."), shard
    return name, None
