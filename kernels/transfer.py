"""Host-to-device copies that do not make the host wait.

A copy from ordinary (pageable) host memory to a GPU waits for the work
already queued on the device, so a step prepared while the previous one runs
(the engine's async scheduling) would wait for it at its first copy. From pinned
memory the copy is queued behind that work instead, and the host goes on.
"""

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`; on a GPU, queued without waiting for the device."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def tensor_on(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype)` on `device`, copied as `to_device` copies."""
    return to_device(torch.tensor(data, dtype=dtype), device)
