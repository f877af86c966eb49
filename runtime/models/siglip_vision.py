"""SigLIP's vision transformer (Gemma 3's vision tower): CLIP's encoder layers (`clip_vision`) over patches with
learned positions, no class token and no pre-norm, a LayerNorm after the last layer. Module names mirror
transformers' `SiglipVisionTransformer`. Not sharded: rank 0 runs it whole (`runtime.worker.encoder_cache`)."""

import torch
from torch import nn
from transformers import PretrainedConfig

from runtime.models.clip_vision import VisionEncoder


class SiglipEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        patch = config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size, kernel_size=patch, stride=patch)
        self.position_embedding = nn.Embedding((config.image_size // patch) ** 2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        return patches.flatten(2).transpose(1, 2) + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    """Pictures [N, 3, image_size, image_size] -> their patches' last hidden states [N, patches, hidden]."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = VisionEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return self.post_layernorm(hidden)
