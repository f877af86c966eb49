"""Runs one scheduled batch through the model: flatten, forward, logits, sample.

The batch is flattened into one token stream (decodes first, then prefill
chunks); logits are computed only where a token is sampled, plus prompt
positions of requests that asked for prompt logprobs.
"""

from dataclasses import dataclass

import torch

from kernels import AttentionMetadata
from runtime.config import EngineConfig
from runtime.errors import InvalidInputError
from runtime.models import CausalLM, load_weights
from runtime.models.decoder import head_dim_of
from runtime.outputs import TokenLogprob
from runtime.sampler import Sampler, token_logprob
from runtime.scheduler import ScheduledBatch
from runtime.sequence import Request

_CPU_KV_BYTES = 2 << 30


@dataclass
class StepResult:
    token_ids: list[int]  # one per sampled sequence, in `batch.sampled` order
    logprobs: list[TokenLogprob | None]
    prompt_logprobs: dict[Request, list[TokenLogprob]]  # logprobs of prompt tokens computed this step


class ModelRunner:
    def __init__(self, config: EngineConfig, eos_token_ids: set[int]):
        self.config = config
        self.device = torch.device(config.device)
        hf = config.hf_config
        torch.manual_seed(config.seed)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(config.torch_dtype)
        with torch.device(self.device):
            self.model = CausalLM(hf, config.max_model_len)
        torch.set_default_dtype(default_dtype)
        load_weights(self.model, config.model_path)
        self.model.eval()
        self.sampler = Sampler(eos_token_ids, self.device)
        self.num_blocks = self._allocate_kv_cache()

    def _allocate_kv_cache(self) -> int:
        cfg = self.config
        attn = self.model.model.layers[0].self_attn
        layers = len(self.model.model.layers)
        shape = (cfg.block_size, attn.num_kv_heads, head_dim_of(cfg.hf_config))
        bytes_per_block = 2 * layers * shape[0] * shape[1] * shape[2] * cfg.torch_dtype.itemsize
        budget = cfg.kv_cache_bytes
        if budget is None:
            if self.device.type == "cuda":
                free, total = torch.cuda.mem_get_info(self.device)
                budget = int(free - total * (1 - cfg.gpu_memory_utilization))
            else:
                budget = _CPU_KV_BYTES
        num_blocks = budget // bytes_per_block
        if num_blocks * cfg.block_size < cfg.max_model_len:
            raise InvalidInputError(
                "kv_cache_bytes",
                f"{budget} bytes hold {num_blocks * cfg.block_size} tokens, "
                f"fewer than max_model_len ({cfg.max_model_len}); raise the budget or lower max_model_len"
            )
        self.kv_cache = torch.zeros((2, layers, num_blocks, *shape), dtype=cfg.torch_dtype, device=self.device)
        for i, layer in enumerate(self.model.model.layers):
            layer.self_attn.k_cache = self.kv_cache[0, i]
            layer.self_attn.v_cache = self.kv_cache[1, i]
        return num_blocks

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        input_ids, positions, query_lens, context_lens, tables = [], [], [], [], []
        logit_rows, prompt_rows = [], []  # rows of the flattened batch whose logits we need
        offset = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            query_lens.append(n)
            context_lens.append(start + n)
            tables.append(seq.block_table)
            if start + n == seq.num_tokens:
                logit_rows.append(offset + n - 1)
            if seq.params.prompt_logprobs is not None and seq.index == 0 and start < seq.num_prompt_tokens - 1:
                last = min(start + n, seq.num_prompt_tokens - 1)  # position predicting the last prompt token
                prompt_rows.append((seq, start, offset, last - start))
            offset += n
        meta = AttentionMetadata.build(
            query_lens, context_lens, tables, self.config.block_size, batch.num_decodes, self.device
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids, pos, meta)
        logits = self.model.compute_logits(hidden[logit_rows])
        token_ids, logprobs = self.sampler(logits, batch.sampled)
        return StepResult(token_ids, logprobs, self._prompt_logprobs(hidden, prompt_rows))

    def _prompt_logprobs(self, hidden: torch.Tensor, rows) -> dict[Request, list[TokenLogprob]]:
        out = {}
        for seq, start, offset, count in rows:
            logprobs = torch.log_softmax(self.model.compute_logits(hidden[offset : offset + count]).float(), dim=-1)
            targets = seq.token_ids[start + 1 : start + 1 + count]
            k = seq.params.prompt_logprobs
            out[seq.request] = [token_logprob(logprobs[i], t, k) for i, t in enumerate(targets)]
        return out
