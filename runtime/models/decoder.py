"""The decoder-only transformer shared by Llama, Qwen2 (Qwen2.5) and Qwen3.

The three differ only in details read from their configs: Qwen2 has biases on
the q/k/v projections, Qwen3 normalises q and k per head and sets its own
head_dim. Module names mirror transformers' so checkpoint names map directly.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import AttentionMetadata, apply_rotary, silu_and_mul
from runtime.distributed import all_reduce
from runtime.models.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from runtime.models.rotary import RotaryTables

# architecture name -> (bias on q/k/v, per-head q/k norm)
ARCHITECTURES = {
    "LlamaForCausalLM": (None, False),  # None: the config's attention_bias
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (None, True),
}


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        head_dim = head_dim_of(config)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, config.num_attention_heads, config.num_key_value_heads, qkv_bias
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size)
        self.q_norm = self.k_norm = None
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
        self.k_cache = self.v_cache = torch.empty(0)  # bound by the model runner

    def forward(self, hidden: torch.Tensor, cos_sin, meta: AttentionMetadata) -> torch.Tensor:
        """Attention runs on the backend that built `meta`, reached through it: metadata is only readable by
        its own backend, so pairing them in one object rules out a mismatch, and the forward pass (a CUDA
        graph's captured one included) needs no backend bound to each layer."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, *cos_sin)
        meta.backend.store_kv(k, v, self.k_cache, self.v_cache, meta)
        out = meta.backend.attend(q, self.k_cache, self.v_cache, meta, self.scale)
        return self.o_proj(out.reshape(-1, q_size))


# On CPU a long prefill goes through the MLP this many rows at a time, so the wide gate/up activations
# stay in cache (measured: 25% less MLP time for a 2,800-token step)
_CPU_MLP_ROWS = 512


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        size = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size], bias)
        self.down_proj = RowParallelLinear(size, config.hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # with LoRA, every projection sees the whole step: its adapters' rows are the step's rows
        if x.is_cuda or x.shape[0] <= _CPU_MLP_ROWS or self.down_proj.lora is not None:
            return self.down_proj(self._gated(x))
        blocks = [self.down_proj(self._gated(rows), reduce=False) for rows in x.split(_CPU_MLP_ROWS)]
        return all_reduce(torch.cat(blocks))  # one collective for the whole step, not one per block

    def _gated(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.self_attn = Attention(config, qkv_bias, qk_norm)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, residual, cos_sin, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, config: PretrainedConfig, qkv_bias: bool, qk_norm: bool, max_positions: int):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, qkv_bias, qk_norm) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryTables(config, head_dim_of(config), max_positions)

    def forward(self, input_ids, positions, meta):
        cos_sin = self.rotary(positions)
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos_sin, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    # checkpoint projection -> (our fused parameter, its shard)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: PretrainedConfig, max_positions: int):
        super().__init__()
        arch = config.architectures[0]
        qkv_bias, qk_norm = ARCHITECTURES[arch]
        if qkv_bias is None:
            qkv_bias = getattr(config, "attention_bias", False)
        self.model = DecoderModel(config, qkv_bias, qk_norm, max_positions)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, meta) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
