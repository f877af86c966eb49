"""Rotary-embedding cos/sin tables, with every RoPE variant transformers knows, one table per set of RoPE
parameters: a config may hold one set per layer type (Gemma 3: its local layers use their own base).

Longrope (Phi-3, Phi-4-mini) has two sets of frequencies: a sequence no longer than the original context is
rotated by the short factors, a longer one by the long factors throughout (transformers' Phi-3 recomputes a
sequence's cache when it grows past the original context; the scheduler does so by preemption,
`Sequence.long_rope`). When max_model_len reaches past the original context, the table holds both: row p the
short rotation of position p, row max_positions + p its long one, and the model runner picks the rows.
"""

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from runtime.errors import InvalidInputError

_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


def rope_key(config: PretrainedConfig, layer: int) -> str:
    """Which RoPE parameters layer `layer` uses: its layer type where the config keys them by layer type, else
    'default'."""
    rope = getattr(config, "rope_parameters", None) or {}
    types = getattr(config, "layer_types", None)
    return types[layer] if types and types[layer] in rope else "default"


def _parameters(config: PretrainedConfig, key: str) -> dict:
    rope = getattr(config, "rope_parameters", None) or _DEFAULT
    return rope[key] if key in rope else rope


def check_rope(config: PretrainedConfig, max_model_len: int) -> None:
    """Refuse RoPE settings these tables would get wrong: an unknown type."""
    for key in {rope_key(config, i) for i in range(config.num_hidden_layers)}:
        kind = _parameters(config, key).get("rope_type", "default")
        if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
            raise InvalidInputError("model", f"rope type {kind!r} is not supported; supported: "
                                    f"{', '.join(['default', *ROPE_INIT_FUNCTIONS])}")


def long_rope_context(config: PretrainedConfig, max_model_len: int) -> int | None:
    """The original context of a longrope model that max_model_len reaches past (its tables then hold long rows
    too), else None."""
    rope = _parameters(config, "default")
    original = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", 0)
    return original if rope.get("rope_type") == "longrope" and max_model_len > original else None


def deinterleave_pairs(x: torch.Tensor) -> torch.Tensor:
    """[..., D] laid out in rotary pairs (x0, x1), (x2, x3), ... (DeepSeek, ERNIE) as halves (x0, x2, ...),
    (x1, x3, ...): rotating halves then rotates each pair as the checkpoint means, and q and k permuted alike
    leave every attention score as it was."""
    *lead, size = x.shape
    return x.reshape(*lead, size // 2, 2).transpose(-1, -2).reshape(*lead, size)


class RotaryTables(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int, key: str = "default"):
        super().__init__()
        rope = _parameters(config, key)
        kind = rope.get("rope_type", "default")
        if kind == "default":  # over the first `partial_rotary_factor` of each head (the other types read it too)
            dim = int(head_dim * (rope.get("partial_rotary_factor") or 1.0))
            exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
            inv_freq, scaling = 1.0 / (rope["rope_theta"] ** exponents), 1.0
        else:
            by_type = {"layer_type": key} if key != "default" else {}
            # on the device the model is being built on (a `torch.device` context), as the positions below are
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, torch.get_default_device(), **by_type)
        positions = torch.arange(max_positions, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq.float())
        original = long_rope_context(config, max_positions) if kind == "longrope" else None
        if original is not None:  # the long rows after the short ones
            long_inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, torch.get_default_device(), seq_len=original + 1,
                                                          **by_type)
            angles = torch.cat([angles, torch.outer(positions, long_inv_freq.float())])
            self.cuda_graphs = False  # a decode graph would read the short rows
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]
