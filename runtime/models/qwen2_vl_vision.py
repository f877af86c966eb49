"""Qwen2-VL's vision tower: Qwen2.5-VL's patches, 2D rotary embedding and merger (`qwen2_5_vl_vision`), with
LayerNorm blocks attending over the whole picture and CLIP's two-layer MLP. Its config names the tower's width
`embed_dim` (its `hidden_size` is the language model's, which the merger projects to). Module names mirror
transformers' `Qwen2VisionTransformerPretrainedModel`. It is not sharded: rank 0 runs it whole."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.models.clip_vision import VisionMLP
from runtime.models.qwen2_5_vl_vision import (
    PatchEmbed,
    PatchMerger,
    VisionBlock,
    layer_norm,
    rotary_cos_sin,
    rotary_frequencies,
)


def tower_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config with the names the shared pieces read: the tower's width as `hidden_size`, the language model's
    as `out_hidden_size`."""
    return PretrainedConfig(**{**config.to_dict(), "hidden_size": config.embed_dim, "out_hidden_size":
                               config.hidden_size, "intermediate_size": config.embed_dim * config.mlp_ratio})


class Qwen2VisionTower(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        config = tower_config(config)
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config)
        self.register_buffer("inv_freq", rotary_frequencies(config), persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(config, layer_norm, VisionMLP(config)) for _ in range(config.depth))
        self.merger = PatchMerger(config, layer_norm)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One picture's merged-patch tokens [t x h x w / merge^2, out_hidden] from its patches [t x h x w, ...]."""
        x = self.patch_embed(patches)
        cos, sin = rotary_cos_sin(self.inv_freq, *grid, self.merge)
        whole = [0, x.shape[0]]
        for block in self.blocks:
            x = block(x, cos, sin, whole)
        return self.merger(x)
