"""The engine's outer loop: `LLMEngine` steps, `AsyncLLMEngine` streams, `EngineProcess` runs it apart, `LLM` for
scripts; requests are checked by a `RequestValidator` before they reach any of them."""
