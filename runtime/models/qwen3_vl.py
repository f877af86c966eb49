"""Qwen3-VL (`Qwen3VLForConditionalGeneration`): Qwen3's language model rotating by interleaved M-RoPE, and the
tower Qwen3.5 shares (`qwen3_5_vision`) with its deep-stack taps, whose rows the first layers' outputs gain at a
picture's tokens."""

from runtime.models.qwen2_5_vl import QwenVisionLanguage
from runtime.models.qwen3 import Qwen3ForCausalLM
from runtime.models.qwen3_5_vision import Qwen3_5VisionTower


class Qwen3VLForConditionalGeneration(QwenVisionLanguage, Qwen3ForCausalLM):
    tower = Qwen3_5VisionTower
    interleaved_rope = True
    mrope_section = [24, 20, 20]
