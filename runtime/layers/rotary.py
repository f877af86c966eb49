"""Rotary-embedding cos/sin tables, with every RoPE variant transformers knows, one table per set of RoPE
parameters: a config may hold one set per layer type (Gemma 3: its local layers use their own base).

Two variants scale their frequencies with a sequence's length once it passes the model's original context, and
run past it as transformers generates with them (`LengthScaledRope`), once max_model_len reaches past it:
- longrope (Phi-3, Phi-4-mini): a sequence within the original context is rotated by the short factors, a longer
  one by the long factors throughout (transformers' Phi-3 recomputes a sequence's cache when it grows past the
  original context; the scheduler does so by preemption);
- dynamic NTK: transformers rotates a pass by a base scaled for the pass's length, so a prompt longer than the
  original context is rotated by the base of its own length, and each token generated past it by the base of the
  length it makes.
A token's row of the tables is then position + max_positions x scale, the scale being what its frequencies are
for (longrope: 0 short, 1 long; dynamic NTK: the length, 0 within the original context); the model runner picks
the rows (`LengthScaledRope.rows`), and dynamic NTK's rows past the original context are computed as they come.
"""

from dataclasses import dataclass

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


def check_rope(config: PretrainedConfig) -> None:
    """Refuse RoPE settings these tables would get wrong: an unknown type."""
    for key in {rope_key(config, i) for i in range(config.num_hidden_layers)}:
        kind = _parameters(config, key).get("rope_type", "default")
        if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
            raise InvalidInputError("model", f"rope type {kind!r} is not supported; supported: "
                                    f"{', '.join(['default', *ROPE_INIT_FUNCTIONS])}")


def max_context(config: PretrainedConfig) -> int:
    """How far the model's positions reach: its max_position_embeddings, times the factor of dynamic NTK (which
    scales past it as it goes)."""
    rope = _parameters(config, "default")
    factor = rope.get("factor", 1.0) if rope.get("rope_type") == "dynamic" else 1.0
    return int(config.max_position_embeddings * factor)


@dataclass(frozen=True)
class LengthScaledRope:
    kind: str  # longrope | dynamic
    original: int  # the context past which the frequencies scale
    max_positions: int

    @classmethod
    def of(cls, config: PretrainedConfig, max_model_len: int) -> "LengthScaledRope | None":
        """The model's, when its frequencies scale with length and max_model_len reaches past its original
        context; else None."""
        rope = _parameters(config, "default")
        kind = rope.get("rope_type")
        if kind == "longrope":
            original = (rope.get("original_max_position_embeddings")
                        or getattr(config, "original_max_position_embeddings", 0))
        elif kind == "dynamic":
            original = config.max_position_embeddings
        else:
            return None
        return cls(kind, original, max_model_len) if max_model_len > original else None

    def sequence_scale(self, num_tokens: int, prompt_len: int) -> int:
        """The scale a sequence is computed with from admission on (`Sequence.rope_scale`; 0 within the original
        context): longrope 1 once it is longer than the original context, dynamic NTK its prompt's length."""
        if self.kind == "longrope":
            return int(num_tokens > self.original)
        return prompt_len if prompt_len > self.original else 0

    def outgrown(self, scale: int, num_tokens: int) -> bool:
        """Whether a running sequence has grown past the frequencies it was computed with, and must be recomputed
        (longrope's short factors past the original context)."""
        return self.kind == "longrope" and not scale and num_tokens > self.original

    def rows(self, scale: int, prompt_len: int, start: int, count: int) -> list[int]:
        """The table rows of a sequence's positions start .. start + count - 1."""
        if self.kind == "longrope":
            return [p + self.max_positions * scale for p in range(start, start + count)]
        return [p + self.max_positions * (scale if p < prompt_len and scale else p + 1 if p >= self.original else 0)
                for p in range(start, start + count)]


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
        self.scaled = LengthScaledRope.of(config, max_positions) if key == "default" else None
        self.scaling = scaling
        if self.scaled is not None:
            self.cuda_graphs = False  # a decode graph would read the rows of positions, not the step's rows
        if self.scaled is not None and kind == "longrope":  # the long rows after the short ones
            long_inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, torch.get_default_device(),
                                                          seq_len=self.scaled.original + 1)
            angles = torch.cat([angles, torch.outer(positions, long_inv_freq.float())])
        if self.scaled is not None and kind == "dynamic":  # what a length's base is computed from
            dim = 2 * inv_freq.shape[0]
            self.dynamic = (rope["rope_theta"], rope["factor"], dim)
            self.register_buffer("exponents", torch.arange(0, dim, 2, dtype=torch.float32) / dim, persistent=False)
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)

    def forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at each token's row (its position, unless the frequencies scale with length)."""
        if self.scaled is None or self.scaled.kind != "dynamic":
            return self.cos[rows], self.sin[rows]
        positions, lengths = rows % self.scaled.max_positions, rows // self.scaled.max_positions
        base, factor, dim = self.dynamic  # as transformers computes a length's base and frequencies, in float32
        scaled_base = base * ((factor * lengths.float() / self.scaled.original) - (factor - 1)) ** (dim / (dim - 2))
        angles = positions.float()[:, None] * (1.0 / (scaled_base[:, None] ** self.exponents))
        within = (lengths == 0)[:, None]
        cos = torch.where(within, self.cos[positions], angles.cos() * self.scaling)
        sin = torch.where(within, self.sin[positions], angles.sin() * self.scaling)
        return cos, sin


class MultimodalRotaryTables(RotaryTables):
    """M-RoPE: rows [3, T] (time, row, column: `runtime.multimodal.mrope`) rotate each frequency by one axis: by
    sections (Qwen2-VL, Qwen2.5-VL: the first `mrope_section[0]` frequencies by time, the next by row, the last by
    column) or `interleaved` (Qwen3-VL, Qwen3.5: every third frequency from the second by row, from the third by
    column, over 3 x their sections, the rest by time). Plain rows [T] are a text token's three equal positions.
    A decode graph rotates by the step's positions, not by these rows: none is captured."""

    cuda_graphs = False

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int, interleaved: bool,
                 default_sections: list[int]):
        """`default_sections`: the family's, where the config names none (as transformers' class defaults)."""
        super().__init__(config, head_dim, max_positions)
        sections = _parameters(config, "default").get("mrope_section", default_sections)
        axis = torch.zeros(self.cos.shape[-1], dtype=torch.long)
        if interleaved:
            for i in (1, 2):
                axis[i : 3 * sections[i] : 3] = i
        else:
            axis[sections[0] : sections[0] + sections[1]] = 1
            axis[sections[0] + sections[1] : sum(sections)] = 2
        self.register_buffer("axis", axis, persistent=False)

    def forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if rows.dim() == 1:
            return super().forward(rows)
        pick = self.axis.expand(1, rows.shape[1], -1)
        return (self.cos[rows].take_along_dim(pick, dim=0)[0], self.sin[rows].take_along_dim(pick, dim=0)[0])
