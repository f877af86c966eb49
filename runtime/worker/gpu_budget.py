"""How much of a GPU the KV cache may take: `gpu_memory_utilization` of the device, less what is in use and the
largest step's activations, measured by running that step."""

import torch

from runtime.worker.step import StepInputs


@torch.inference_mode()
def gpu_kv_budget(runner, use_graphs: bool) -> int:
    """KV bytes that `gpu_memory_utilization` of the whole device leaves once what is already in use (this
    engine's weights, other processes and engines) and the largest step's activations are accounted for.

    Runs the largest step the scheduler can form (max_num_batched_tokens prompt tokens, in sequences of
    at most max_model_len, over a scratch cache) and samples max_num_seqs rows, recording the peak.
    """
    cfg = runner.config
    tokens, seq_len = cfg.max_num_batched_tokens, min(runner.spec.max_model_len, cfg.max_num_batched_tokens)
    lens = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    blocks_per_seq = -(-seq_len // cfg.block_size)
    scratch = torch.empty((runner.kv_planes(), len(lens) * blocks_per_seq, *runner.block_shape()),
                          dtype=runner.kv_cache_dtype, device=runner.device)
    for attention in runner.attention_layers:
        attention.k_cache, attention.v_cache = scratch[0], scratch[-1]
    torch.cuda.synchronize(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    before = torch.cuda.memory_allocated(runner.device)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(len(lens))]
    inputs = StepInputs([0] * tokens, [p for n in lens for p in range(n)], lens, lens, tables, 0, [], [],
                        state_slots=[i % cfg.max_num_seqs for i in range(len(lens))])
    hidden = runner.forward(inputs)
    workspace = []
    if runner.model.lm_head is not None:  # a base (embedding) model samples nothing
        logits = runner.model.compute_logits(hidden[: min(cfg.max_num_seqs, tokens)]).float()
        # the sampler's worst case: raw logprobs, processed logits, probabilities and their float64 CDF
        workspace = [logits, torch.log_softmax(logits, -1), logits.clone(), torch.softmax(logits, -1),
                     torch.empty_like(logits, dtype=torch.float64)]
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device) - before  # the scratch cache was already in `before`
    del hidden, workspace, scratch
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(runner.device)
    budget = int(total * cfg.gpu_memory_utilization) - (total - free) - peak
    if use_graphs:  # room for the decode graphs' pool: their largest batch's logits and activations, twice
        budget -= 2 * cfg.max_num_seqs * (runner.model.lm_head.vocab_size * 4 + 64 * 1024)
    return budget
