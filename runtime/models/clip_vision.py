"""CLIP's vision transformer (LLaVA's vision tower): patches and a class token, learned positions, pre-norm
encoder layers with bidirectional attention. Module names mirror transformers' `CLIPVisionTransformer`, so the
checkpoint's names map directly. It is not sharded: rank 0 runs it whole (`runtime.worker.encoder_cache`)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import activation


class VisionEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        dim, patch = config.hidden_size, config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(dim))
        self.patch_embedding = nn.Conv2d(config.num_channels, dim, kernel_size=patch, stride=patch, bias=False)
        self.position_embedding = nn.Embedding((config.image_size // patch) ** 2 + 1, dim)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class VisionAttention(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class VisionMLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.activation = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class VisionLayer(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """The encoder's hidden states (index 0: the normed embeddings, i: after layer i), as many layers deep as
    the deepest that is read: the layers past it are neither built nor loaded."""

    def __init__(self, config: PretrainedConfig, num_layers: int):
        super().__init__()
        self.embeddings = VisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # transformers' spelling
        self.encoder = VisionEncoder(config, num_layers)

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return states
