"""Qwen2.5-VL's vision tower: 3D patches (two frames of 14-pixel squares; a picture is its own two frames), a
2D rotary embedding of each patch's row and column, blocks that attend within windows of merged patches (those
in `fullatt_block_indexes` over the whole picture), and a merger that folds each 2 x 2 block of patches into one
token of the language model. Patches reach the tower ordered block by block (the processor's layout), the
windows reorder them, and the merger's output is put back in raster order of merged patches. Module names mirror
transformers' `Qwen2_5_VisionTransformerPretrainedModel`. It is not sharded: rank 0 runs it whole."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from runtime.layers.mlp import activation
from runtime.layers.norms import RMSNorm


class PatchEmbed(nn.Module):
    def __init__(self, config: PretrainedConfig, bias: bool = False):
        super().__init__()
        self.shape = (config.in_channels, config.temporal_patch_size, config.patch_size, config.patch_size)
        kernel = self.shape[1:]
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=kernel, stride=kernel, bias=bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = patches.view(-1, *self.shape).to(self.proj.weight.dtype)
        return self.proj(x).view(x.shape[0], -1)


class VisionAttention(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        """Attention within each segment [bounds[i], bounds[i + 1]) of the patches."""
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, -1).unbind(1)
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        out = torch.cat([F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                        v[a:b].transpose(0, 1)).transpose(0, 1)
                         for a, b in zip(bounds, bounds[1:])])
        return self.proj(out.reshape(x.shape[0], -1))


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding over whole heads (halves), in float32 as transformers applies it."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    """The gated MLP of Qwen2.5-VL's tower (and, without biases, Pixtral's)."""

    def __init__(self, config: PretrainedConfig, bias: bool = True):
        super().__init__()
        self.activation = activation(config.hidden_act)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


def rms_norm(size: int) -> nn.Module:
    return RMSNorm(size, 1e-6)


def layer_norm(size: int) -> nn.Module:
    return nn.LayerNorm(size, eps=1e-6)


class VisionBlock(nn.Module):
    """A tower's block: `norm` (Qwen2.5-VL's RMSNorm, the others' LayerNorm), attention, `norm`, `mlp`."""

    def __init__(self, config: PretrainedConfig, norm: Callable[[int], nn.Module], mlp: nn.Module):
        super().__init__()
        self.norm1 = norm(config.hidden_size)
        self.norm2 = norm(config.hidden_size)
        self.attn = VisionAttention(config)
        self.mlp = mlp

    def forward(self, x, cos, sin, bounds):
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, config: PretrainedConfig, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = norm(config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(),
                                 nn.Linear(self.width, config.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class Qwen2_5VisionTower(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.merge = config.spatial_merge_size
        self.window = config.window_size // config.spatial_merge_size // config.patch_size  # in merged patches
        self.full_attention = set(config.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(config)
        self.register_buffer("inv_freq", rotary_frequencies(config), persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(config, rms_norm, VisionMLP(config)) for _ in range(config.depth))
        self.merger = PatchMerger(config, rms_norm)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One picture's merged-patch tokens [t x h x w / merge^2, out_hidden] from its patches [t x h x w, ...]."""
        t, h, w = grid
        unit = self.merge**2
        order, window_bounds = self._windows(t, h // self.merge, w // self.merge)
        x = self.patch_embed(patches)
        x = x.view(-1, unit, x.shape[-1])[order].reshape(x.shape)
        cos, sin = (c.view(-1, unit, c.shape[-1])[order].reshape(c.shape)
                    for c in rotary_cos_sin(self.inv_freq, t, h, w, self.merge))
        whole = [0, x.shape[0]]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, whole if i in self.full_attention else window_bounds)
        return self.merger(x)[torch.argsort(order)]

    def _windows(self, t: int, h: int, w: int) -> tuple[torch.Tensor, list[int]]:
        """The merged patches' order window by window (each window `self.window` merged patches square, the last
        ones cut at the edge), and the windows' bounds in patches."""
        size = self.window
        index = torch.arange(t * h * w).view(t, h, w)
        pad_h, pad_w = -h % size, -w % size
        padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
        padded = padded.view(t, (h + pad_h) // size, size, (w + pad_w) // size, size).permute(0, 1, 3, 2, 4)
        windows = padded.reshape(-1, size * size)
        counts = (windows >= 0).sum(-1)
        order = windows[windows >= 0]
        bounds = [0, *(counts[counts > 0].cumsum(0) * self.merge**2).tolist()]
        return order, bounds


def rotary_frequencies(config: PretrainedConfig) -> torch.Tensor:
    """The 2D rotary embedding's frequencies: a quarter of a head's width, for rows and again for columns."""
    quarter = config.hidden_size // config.num_heads // 2
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return 1.0 / theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter)


def rotary_cos_sin(inv_freq: torch.Tensor, t: int, h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2D rotary embedding's cos and sin for each patch: a head's first half of frequencies by its row, the
    second by its column (repeated over both halves), the patches laid out block by block of merge x merge."""
    rows = torch.arange(h)[:, None].expand(h, w).reshape(h // merge, merge, w // merge, merge).transpose(1, 2)
    cols = torch.arange(w)[None, :].expand(h, w).reshape(h // merge, merge, w // merge, merge).transpose(1, 2)
    positions = torch.stack([rows.flatten(), cols.flatten()], dim=-1).repeat(t, 1).float()
    freqs = torch.cat([positions[:, :1] * inv_freq, positions[:, 1:] * inv_freq], dim=-1)
    return torch.cat([freqs.cos()] * 2, dim=-1), torch.cat([freqs.sin()] * 2, dim=-1)
