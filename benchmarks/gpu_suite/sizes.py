"""The sizes the suite's checks run at: on the GPU, and in the CPU dry run."""

from dataclasses import dataclass, field

import torch

from benchmarks.gpu_throughput import QWEN25_05B

TINY = dict(arch="qwen2", dtype=torch.float32)  # testing.model_factory's defaults: 2 layers, hidden 64


@dataclass(frozen=True)
class Sizes:
    dry_run: bool
    model: dict  # build_model_dir's arguments for the benchmark model
    # the served path's: its vocabulary the tokenizer's, so every token streams as text (the benchmark model's
    # tokenizer covers only the first 512 of its 151,936 ids)
    served_model: dict
    engine: dict  # engine options every check's engine shares
    # engine tests: pytest's arguments
    tests: tuple[str, ...]
    # throughput (nano-vllm's benchmark shape): sequences, input/output length range; transformers' share of
    # the sequences and its cap on their output lengths (its static batches run to the longest)
    sequences: int
    lengths: tuple[int, int]
    hf_sequences: int
    hf_max_output: int
    # decode profile
    decode_batch: int
    decode_context: int
    decode_steps: int
    # served path: stream concurrencies (2x as many requests each) and output tokens per stream
    concurrencies: tuple[int, ...]
    served_output: int
    # LoRA, structured outputs, speculative decoding
    adapters: int
    rank: int
    feature_requests: int
    feature_output: int
    structured_concurrency: int
    speculative_requests: int
    quantizable_model: dict  # the `quantized` check's: widths in whole groups of 128
    sampler_vocab: int
    targets: dict = field(default_factory=dict)
    vision_pictures: int = 2  # one-picture chats timed (cold, then cached) and pictures through the encoder

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"


ENGINE_TEST_FILES = ("tests/kernels/test_triton_kernels.py", "tests/runtime/test_greedy_parity.py",
                     "tests/runtime/test_async_scheduling.py", "tests/runtime/test_model_families.py",
                     "tests/runtime/test_quantized_checkpoints.py", "tests/runtime/test_hybrid_attention.py",
                     "tests/runtime/test_kv_offload.py", "tests/runtime/test_vision_models.py")

GPU = Sizes(
    dry_run=False, model=QWEN25_05B, served_model={**QWEN25_05B, "vocab_size": 512, "tokenizer_vocab": None},
    engine=dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=256, max_num_batched_tokens=16384,
                gpu_memory_utilization=0.45),
    # tensor parallel needs two GPUs; logprob parity, the families' slowest check, runs on CPU in CI
    tests=(*ENGINE_TEST_FILES, "-k", "not tp2 and not logprobs_match"),
    sequences=256, lengths=(100, 1024), hf_sequences=16, hf_max_output=256,
    decode_batch=256, decode_context=512, decode_steps=20,
    concurrencies=(64, 256), served_output=128,
    adapters=8, rank=16, feature_requests=128, feature_output=128, structured_concurrency=64,
    speculative_requests=8, quantizable_model=QWEN25_05B, sampler_vocab=151936,
    targets=dict(output_tok_s=40_000, served_over_offline=0.85, lora_over_base=0.8,
                 structured_over_unconstrained=0.9),
    vision_pictures=32,
)

DRY = Sizes(
    dry_run=True, model=TINY, served_model=TINY,
    engine=dict(dtype="float32", max_model_len=512, max_num_seqs=8, kv_cache_bytes=16 << 20),
    tests=("tests/kernels/test_triton_kernels.py::test_rotary",
           "tests/kernels/test_triton_kernels.py::test_gated_delta_rule_over_decodes_and_prefill_chunks",
           "tests/kernels/test_triton_kernels.py::test_sampling_equals_the_reference"),
    sequences=6, lengths=(8, 24), hf_sequences=2, hf_max_output=16,
    decode_batch=4, decode_context=16, decode_steps=2,
    concurrencies=(2, 4), served_output=8,
    adapters=2, rank=4, feature_requests=4, feature_output=8, structured_concurrency=2,
    speculative_requests=2, sampler_vocab=2048,
    quantizable_model={**TINY, "arch": "qwen3", "hidden_size": 256, "intermediate_size": 512, "num_heads": 4,
                       "num_kv_heads": 2, "head_dim": 64},
)
