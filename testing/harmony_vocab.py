"""gpt-oss's vocabulary offline, for the harmony tests.

harmony accepts `o200k_base.tiktoken` only byte for byte (it checks the SHA-256), so no smaller vocabulary can
stand in. The `quicktok-v1` package ships o200k_base's ranks (MIT, derived from tiktoken) as records of a
u16 length, the token's bytes and a u32 rank after a u32 count; this writes them back in tiktoken's format.
"""

import base64
import struct
from importlib.resources import files
from pathlib import Path

from transformers import GenerationConfig, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from testing.model_factory import build_model_dir

O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
# o200k_harmony's special tokens; the other ids from 199998 to 201087 are <|reserved_ID|>
SPECIALS = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
            200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}
VOCAB_SIZE = 201088


def write_o200k_base(directory: Path) -> Path:
    """Write `o200k_base.tiktoken` into `directory` (harmony's `TIKTOKEN_ENCODINGS_BASE`)."""
    data = files("quicktok").joinpath("data/o200k.vocab").read_bytes()
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        ranks.append((rank, token))
        offset += 6 + length
    path = Path(directory) / "o200k_base.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in sorted(ranks)))
    return path


def build_gpt_oss_dir(path: Path, vocab_file: Path) -> Path:
    """A tiny random gpt-oss checkpoint with gpt-oss's tokenizer (o200k_harmony, converted by transformers)."""
    build_model_dir(path, "gpt_oss", hidden_size=32, intermediate_size=32, num_heads=4, num_kv_heads=2,
                    vocab_size=VOCAB_SIZE, tokenizer_vocab=512)
    names = [SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(199998, VOCAB_SIZE)]
    converted = TikTokenConverter(vocab_file=str(vocab_file), pattern=O200K_PATTERN,
                                  extra_special_tokens=names).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token="<|return|>",
                                        pad_token="<|endoftext|>")
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (path / stale).unlink(missing_ok=True)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=[200002, 199999, 200012], bos_token_id=None).save_pretrained(path)
    return path
