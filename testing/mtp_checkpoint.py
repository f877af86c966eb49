"""A DeepSeek-V3 (or GLM-4.5) checkpoint with a multi-token-prediction layer, as DeepSeek and Zhipu save one
(transformers writes none), and the prediction layer's own reference: transformers' model of the family with that
one layer."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM


def add_mtp_layer(source: Path, path: Path, seed: int = 1) -> Path:
    """Copy the checkpoint at `source` to `path` with a prediction layer after its last decoder layer: a decoder
    layer of random weights (shaped as the last one), its norms, `eh_proj`, and copies of the embedding and head."""
    import shutil

    shutil.copytree(source, path, dirs_exist_ok=True)
    config = AutoConfig.from_pretrained(source)
    state = load_file(source / "model.safetensors")
    last, mtp = f"model.layers.{config.num_hidden_layers - 1}.", f"model.layers.{config.num_hidden_layers}."
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in list(state.items()):
        if name.startswith(last):
            noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std().nan_to_num(0.02)
            state[name.replace(last, mtp)] = (tensor.clone() if tensor.dim() < 2 else noise.to(tensor.dtype))
    hidden = config.hidden_size
    state[f"{mtp}enorm.weight"] = torch.ones(hidden) + 0.1 * torch.randn(hidden, generator=generator)
    state[f"{mtp}hnorm.weight"] = torch.ones(hidden) + 0.1 * torch.randn(hidden, generator=generator)
    state[f"{mtp}eh_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=generator)
    state[f"{mtp}shared_head.norm.weight"] = torch.ones(hidden)
    state[f"{mtp}embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    state[f"{mtp}shared_head.head.weight"] = state["lm_head.weight"].clone()
    save_file(state, path / "model.safetensors")
    return path


def mtp_first_draft(path: Path, tokens: list[int]) -> int:
    """The prediction layer's draft after `tokens` (a prompt and the token sampled after it), computed with
    transformers: the target's final hidden states at every position but the last, the embeddings of the tokens
    after them, and the layer loaded as a one-layer DeepSeek-V3 whose final norm and head are the layer's own."""
    import tempfile

    config = AutoConfig.from_pretrained(path)
    state = load_file(path / "model.safetensors")
    mtp = f"model.layers.{config.num_hidden_layers}."
    weights = {name.replace(mtp, "model.layers.0."): t for name, t in state.items() if name.startswith(mtp)}
    weights["model.norm.weight"] = weights.pop("model.layers.0.shared_head.norm.weight")
    weights["lm_head.weight"] = weights.pop("model.layers.0.shared_head.head.weight")
    weights["model.embed_tokens.weight"] = weights.pop("model.layers.0.embed_tokens.weight")
    enorm, hnorm, eh_proj = (weights.pop(f"model.layers.0.{name}.weight") for name in ("enorm", "hnorm", "eh_proj"))
    with tempfile.TemporaryDirectory() as one_layer:
        one = AutoConfig.from_pretrained(path)
        one.num_hidden_layers, one.first_k_dense_replace = 1, 0
        one.save_pretrained(one_layer)
        save_file(weights, Path(one_layer) / "model.safetensors")
        layer = AutoModelForCausalLM.from_pretrained(one_layer, dtype=torch.float32).eval()
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def norm(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps))

    with torch.no_grad():
        hidden = target.model(torch.tensor([tokens[:-1]])).last_hidden_state
        embedded = target.model.embed_tokens(torch.tensor([tokens[1:]]))
        x = torch.cat([norm(embedded, enorm), norm(hidden, hnorm)], dim=-1) @ eh_proj.T
        return int(layer(inputs_embeds=x).logits[0, -1].argmax())
