"""The check that bfloat16 greedy tokens are right when no two bf16 implementations round alike."""

import torch
from transformers import AutoModelForCausalLM


def assert_tokens_are_bf16_argmax(model_dir, prompts: list[list[int]], outputs: list[list[int]], device: str) -> None:
    """Every token we chose must be the argmax of transformers' bf16 logits on the same device (fed our tokens),
    up to bf16's rounding of those logits: near-ties may break either way."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    for prompt, ours in zip(prompts, outputs):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ours[:-1]], device=device)).logits[0, len(prompt) - 1 :].float()
        best = logits.max(dim=-1).values
        chosen = logits[torch.arange(len(ours)), torch.tensor(ours, device=device)]
        tolerance = 0.03 * best.abs()  # 4 bf16 ulps
        assert (best - chosen <= tolerance).all(), (best - chosen).max()
        assert (logits >= (best - tolerance)[:, None]).sum(dim=-1).float().mean() < 3  # the check excludes most tokens
