"""LoRA adapters: read in PEFT's format (adapter.py), held in device slots (slots.py), applied batched across
adapters in one forward (layers.py)."""

from runtime.lora.adapter import LoRAAdapter, LoRARequest, load_adapter
from runtime.lora.layers import LoRABatch, attach_lora, load_into_slot
from runtime.lora.slots import AdapterSlots

__all__ = ["AdapterSlots", "LoRAAdapter", "LoRABatch", "LoRARequest", "attach_lora", "load_adapter",
           "load_into_slot"]
