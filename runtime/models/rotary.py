"""Rotary-embedding cos/sin tables, with every RoPE variant transformers knows."""

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


class RotaryTables(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int):
        super().__init__()
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
        kind = rope.get("rope_type", "default")
        if kind == "default":
            exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
            inv_freq, scaling = 1.0 / (rope["rope_theta"] ** exponents), 1.0
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]
