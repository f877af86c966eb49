"""Llama 4's vision tower (`Llama4VisionModel`): each tile of the checkpoint's `image_size` cut into patches by an
unfolding linear map, a class token appended after them, learned positions added, a LayerNorm, LayerNorm blocks
attending over the tile under a 2D rotary embedding over interleaved pairs (a patch's column rotates the first half
of each head's frequencies, its row the second; the class token is not rotated), a final LayerNorm, the class token
dropped, and a pixel shuffle that folds each 2 x 2 block of patches into one row before a two-layer GELU MLP.
Module names mirror transformers'. Not sharded: rank 0 runs it whole (`runtime.worker.encoder_cache`)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.rotary import deinterleave_pairs
from runtime.models.clip_vision import VisionMLP
from runtime.models.qwen2_5_vl_vision import rotate_halves


class Llama4VisionAttention(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        dim = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tiles, length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(tiles * length, self.num_heads, -1)

        # q and k taken from rotary pairs to halves alike (every score as it was), then rotated by halves
        q = rotate_halves(deinterleave_pairs(heads(self.q_proj(x))), cos, sin)
        k = rotate_halves(deinterleave_pairs(heads(self.k_proj(x))), cos, sin)

        def by_tile(t: torch.Tensor) -> torch.Tensor:
            return t.view(tiles, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(by_tile(q), by_tile(k), by_tile(heads(self.v_proj(x))))
        return self.o_proj(out.transpose(1, 2).reshape(tiles, length, dim))


class Llama4VisionEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size)  # transformers' take no eps from the config
        self.self_attn = Llama4VisionAttention(config)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size)
        self.mlp = VisionMLP(config)
        self.mlp.activation = nn.GELU()  # whatever the config's hidden_act, as transformers builds it

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama4VisionEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.layers = nn.ModuleList(Llama4VisionEncoderLayer(config) for _ in range(config.num_hidden_layers))


class Llama4UnfoldConvolution(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.linear = nn.Linear(config.num_channels * self.patch_size**2, config.hidden_size, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Tiles [T, C, S, S] -> their patches [T, (S / patch)^2, hidden], raster order."""
        patches = F.unfold(pixel_values, kernel_size=self.patch_size, stride=self.patch_size)
        return self.linear(patches.transpose(1, 2))


class Llama4VisionMLP2(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.intermediate_size, config.projector_input_dim, bias=False)
        self.fc2 = nn.Linear(config.projector_output_dim, config.projector_output_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc2(F.gelu(self.fc1(x))))


class Llama4VisionPixelShuffleMLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.ratio = config.pixel_shuffle_ratio
        self.mlp = Llama4VisionMLP2(config)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """Patches [T, side^2, C] -> [T, (side * ratio)^2, C / ratio^2] through the MLP, as transformers'
        `pixel_shuffle` moves them: columns folded into channels, the grid transposed, rows folded, transposed
        back."""
        tiles, count, channels = patches.shape
        side = int(count**0.5)
        grid = patches.reshape(tiles, side, int(side * self.ratio), int(channels / self.ratio)).transpose(1, 2)
        grid = grid.reshape(tiles, int(side * self.ratio), int(side * self.ratio), int(channels / self.ratio**2))
        return self.mlp(grid.transpose(1, 2).reshape(tiles, -1, grid.shape[-1]))


class Llama4VisionModel(nn.Module):
    """Tiles [T, C, S, S] -> their rows [T, tokens a tile, projector_output_dim]."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        dim, side = config.hidden_size, config.image_size // config.patch_size
        self.patch_embedding = Llama4UnfoldConvolution(config)
        self.class_embedding = nn.Parameter(torch.empty(dim))
        self.positional_embedding_vlm = nn.Parameter(torch.empty(side**2 + 1, dim))
        self.layernorm_pre = nn.LayerNorm(dim)
        self.layernorm_post = nn.LayerNorm(dim)
        self.model = Llama4VisionEncoder(config)
        self.vision_adapter = Llama4VisionPixelShuffleMLP(config)
        head_dim = dim // config.num_attention_heads
        # each axis's frequencies, a quarter of a head's dimensions, at (column + 1) and (row + 1); the class token's 0
        freq_dim = head_dim // 2
        inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, freq_dim, 2).float() / freq_dim)
        patch = torch.arange(side**2)
        angles = torch.cat([((patch % side + 1)[:, None] * inv_freq), ((patch // side + 1)[:, None] * inv_freq)], -1)
        angles = torch.cat([angles, torch.zeros(1, angles.shape[1])])
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin(), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.patch_embedding(pixel_values.to(self.patch_embedding.linear.weight.dtype))
        cls = self.class_embedding.expand(hidden.shape[0], 1, -1)
        hidden = self.layernorm_pre(torch.cat([hidden, cls], dim=1) + self.positional_embedding_vlm)
        cos, sin = self.cos.repeat(hidden.shape[0], 1), self.sin.repeat(hidden.shape[0], 1)
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin)
        return self.vision_adapter(self.layernorm_post(hidden)[:, :-1])
