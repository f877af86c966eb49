"""Which attention implementation runs: `torch` on CPU (and as the oracle), `triton` as the GPU default,
`flash` when vllm-flash-attn imports and matches the installed torch."""

from kernels import flash

BACKENDS = ("torch", "triton", "flash")


def choose_attention_backend(requested: str, device: str) -> str:
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown {requested!r}; available: auto, {', '.join(BACKENDS)}")
        if requested != "torch" and device != "cuda":
            raise ValueError(f"{requested!r} needs a CUDA device")
        if requested == "flash" and not flash.available():
            raise ValueError("'flash' needs vllm-flash-attn built for the installed torch")
        return requested
    if device != "cuda":
        return "torch"
    return "flash" if flash.available() else "triton"
