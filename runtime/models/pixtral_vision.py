"""Pixtral's vision tower (Mistral 3's): patches of the picture at its own size (no padding, no resizing of
positions), an RMSNorm, and RMSNorm blocks attending over the whole picture under a 2D rotary embedding (a patch's
row rotates the first half of each half-head's frequencies, its column the second), with a gated MLP. Module names
mirror transformers' `PixtralVisionModel`. Not sharded: rank 0 runs it whole (`runtime.worker.encoder_cache`)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.norms import RMSNorm
from runtime.models.qwen2_5_vl_vision import VisionMLP, rotate_halves

_EPS = 1e-5  # transformers' Pixtral norms take no eps from the config


class PixtralAttention(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        dim = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(x.shape[0], self.num_heads, -1)

        q = rotate_halves(heads(self.q_proj(x)), cos, sin)
        k = rotate_halves(heads(self.k_proj(x)), cos, sin)
        v = heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return self.o_proj(out.transpose(0, 1).reshape(x.shape))


class PixtralLayer(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, _EPS)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, _EPS)
        self.feed_forward = VisionMLP(config, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class PixtralTransformer(nn.Module):
    def __init__(self, config: PretrainedConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(PixtralLayer(config) for _ in range(num_layers))


class PixtralVisionTower(nn.Module):
    """A picture [1, 3, H, W] -> its patches' hidden states (index 0: the normed patches, i: after layer i),
    [H / patch x W / patch, hidden] each in raster order, as many layers deep as the deepest that is read."""

    def __init__(self, config: PretrainedConfig, num_layers: int):
        super().__init__()
        self.patch_conv = nn.Conv2d(config.num_channels, config.hidden_size, kernel_size=config.patch_size,
                                    stride=config.patch_size, bias=False)
        self.ln_pre = RMSNorm(config.hidden_size, _EPS)
        self.transformer = PixtralTransformer(config, num_layers)
        head_dim = config.hidden_size // config.num_attention_heads
        theta = config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
        self.register_buffer("row_freq", inv_freq[0::2], persistent=False)
        self.register_buffer("column_freq", inv_freq[1::2], persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        grid = self.patch_conv(pixel_values.to(self.patch_conv.weight.dtype))[0]  # [hidden, rows, columns]
        rows, columns = grid.shape[1:]
        hidden = self.ln_pre(grid.flatten(1).T)
        row, column = torch.meshgrid(torch.arange(rows, device=grid.device), torch.arange(columns, device=grid.device),
                                     indexing="ij")
        angles = torch.cat([row.reshape(-1, 1) * self.row_freq, column.reshape(-1, 1) * self.column_freq], dim=-1)
        cos, sin = torch.cat([angles, angles], dim=-1).cos(), torch.cat([angles, angles], dim=-1).sin()
        states = [hidden]
        for layer in self.transformer.layers:
            hidden = layer(hidden, cos, sin)
            states.append(hidden)
        return states
