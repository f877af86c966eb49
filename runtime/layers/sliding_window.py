"""Which decoder layers attend through a sliding window, and how far back any layer reads.

A sliding layer at position p sees positions p - W + 1 .. p (W = `sliding_window`, the query's own position
included, as transformers' masks have it). Configs with `layer_types` (Qwen2 and Qwen3 with
`use_sliding_window`, Gemma 2/3, gpt-oss) name each layer's kind; others (Mistral, Mixtral, Phi-3, Qwen3-MoE)
slide on every layer when `sliding_window` is set. A window that max_model_len never exceeds is no window.
"""

from transformers import PretrainedConfig


def layer_windows(config: PretrainedConfig, max_model_len: int) -> list[int | None]:
    """Each decoder layer's window, None where it attends to the whole context."""
    window = getattr(config, "sliding_window", None)
    layers = config.num_hidden_layers
    if not window or window >= max_model_len:
        return [None] * layers
    types = getattr(config, "layer_types", None)
    if types is None:
        return [window] * layers
    return [window if kind == "sliding_attention" else None for kind in types]


def kv_window(config: PretrainedConfig, max_model_len: int) -> int | None:
    """How many trailing positions any layer reads, when every layer slides: KV blocks wholly before a sequence's
    last `kv_window` positions are never read again. None when a layer attends to the whole context (with mixed
    layers the full ones keep every block)."""
    windows = layer_windows(config, max_model_len)
    return None if None in windows else max(windows)
