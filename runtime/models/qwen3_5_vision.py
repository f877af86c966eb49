"""Qwen3-VL's and Qwen3.5's vision tower: 3D patches with a bias, a learned square grid of positions resized
bilinearly to each picture's grid (corners aligned), the 2D rotary embedding of Qwen2.5-VL's tower, LayerNorm blocks
attending over the whole picture, and a merger folding each 2 x 2 block of patches into one token. Qwen3-VL's also
taps some blocks (`deepstack_visual_indexes`), each through a merger of its own: those rows are added to the
language model's hidden states at the picture's tokens after its first layers (`DecoderModel`), so the tower's
output per token is the merger's rows and then each tap's, side by side. Module names mirror transformers'
`Qwen3VLVisionModel`. It is not sharded: rank 0 runs it whole."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import activation
from runtime.models.qwen2_5_vl_vision import (
    PatchEmbed,
    VisionBlock,
    layer_norm,
    rotary_cos_sin,
    rotary_frequencies,
)


class VisionMLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.activation = activation(config.hidden_act)
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.activation(self.linear_fc1(x)))


class PatchMerger(nn.Module):
    """Each 2 x 2 block of patches into one token; normed before the blocks are gathered, or (a deep-stack tap's,
    `after_gather`) after."""

    def __init__(self, config: PretrainedConfig, after_gather: bool = False):
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size**2
        self.after_gather = after_gather
        self.norm = nn.LayerNorm(self.width if after_gather else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.after_gather else self.norm(x).view(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3_5VisionTower(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.merge = config.spatial_merge_size
        self.side = int(config.num_position_embeddings**0.5)  # the learned grid of positions is side x side
        self.patch_embed = PatchEmbed(config, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.register_buffer("inv_freq", rotary_frequencies(config), persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(config, layer_norm, VisionMLP(config)) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        self.taps = list(getattr(config, "deepstack_visual_indexes", None) or [])
        if self.taps:
            self.deepstack_merger_list = nn.ModuleList(PatchMerger(config, after_gather=True) for _ in self.taps)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One picture's merged-patch tokens [t x h x w / merge^2, out_hidden] from its patches [t x h x w, ...]
        (laid out block by block of merge x merge, as the processor writes them)."""
        t, h, w = grid
        x = self.patch_embed(patches) + self._positions(t, h, w).to(self.pos_embed.weight.dtype)
        cos, sin = rotary_cos_sin(self.inv_freq, t, h, w, self.merge)
        whole = [0, x.shape[0]]
        tapped = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, whole)
            if i in self.taps:
                tapped.append(self.deepstack_merger_list[self.taps.index(i)](x))
        return torch.cat([self.merger(x), *tapped], dim=-1)

    def _positions(self, t: int, h: int, w: int) -> torch.Tensor:
        """The learned positions resized to the picture's h x w patches, in the patches' block order."""
        grid = self.pos_embed.weight.view(self.side, self.side, -1).permute(2, 0, 1)[None].float()
        resized = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=True)[0]  # [hidden, h, w]
        m = self.merge
        blocks = resized.view(-1, h // m, m, w // m, m).permute(1, 3, 2, 4, 0).reshape(h * w, -1)
        return blocks.repeat(t, 1)
