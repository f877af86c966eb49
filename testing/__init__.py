"""What tests and benchmarks build on: tiny random-weight models and tokenizers made on the spot, LoRA adapters,
harmony's vocabulary rebuilt offline, and small helpers (free ports, waiting on a condition)."""
