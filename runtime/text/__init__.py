"""Text in and out: the tokenizer and chat template, incremental detokenization with stop strings, structured
output grammars, and gpt-oss's harmony format."""
