"""A mixture-of-experts step's (token, expert) pairs put in expert order: what every grouped product over
the experts (torch, C++, Triton) starts from."""

import torch


def sort_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's (token, k) pairs by expert: the flat expert ids, the pair indices in expert order (stable) and
    each expert's pair count (an index_add, not a bincount, which syncs on CUDA)."""
    flat = ids.flatten()
    counts = torch.zeros(num_experts, dtype=flat.dtype, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
    return flat, flat.argsort(stable=True), counts
