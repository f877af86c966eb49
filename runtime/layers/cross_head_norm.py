"""Attention whose q and k norms span the whole projection, every head at once, rather than each head (OLMo 2,
MiniMax-M2); under tensor parallelism the mean square is summed over the ranks' heads (`ShardedRMSNorm`)."""

import torch
from transformers import PretrainedConfig

from runtime.distributed import tp_size
from runtime.errors import InvalidInputError
from runtime.layers.attention import Attention, head_dim_of
from runtime.layers.norms import ShardedRMSNorm


class CrossHeadNormAttention(Attention):
    def __init__(self, config: PretrainedConfig, qkv_bias: bool, o_bias: bool, window: int | None):
        super().__init__(config, qkv_bias, o_bias, None, window)
        if self.num_kv_heads * tp_size() != config.num_key_value_heads:
            raise InvalidInputError("tensor_parallel_size", f"the k norm spans every KV head: "
                                    f"{config.num_key_value_heads} of them cannot be split over {tp_size()} ranks")
        head_dim = head_dim_of(config)
        self.q_norm = ShardedRMSNorm(config.num_attention_heads * head_dim, config.rms_norm_eps)
        self.k_norm = ShardedRMSNorm(config.num_key_value_heads * head_dim, config.rms_norm_eps)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q.flatten(1)).view_as(q), self.k_norm(k.flatten(1)).view_as(k)
