"""Random LoRA adapters made with PEFT, saved as PEFT saves them: what the engine loads and the reference it is
checked against."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = ATTENTION + ["gate_proj", "up_proj", "down_proj"]


def make_adapter(model_dir, out_dir, rank: int, alpha: int, targets: list[str], rslora: bool, seed: int):
    """A PEFT adapter with random A and B (PEFT's init would make B zero: no effect to check)."""
    return adapt(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), out_dir, rank, alpha, targets,
                 rslora, seed)


def adapt(base: torch.nn.Module, out_dir, rank: int, alpha: int, targets: list[str], rslora: bool, seed: int):
    """`make_adapter` over a model already loaded (a quantized checkpoint's reference)."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                        init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.3)
    model.save_pretrained(out_dir)
    return model
