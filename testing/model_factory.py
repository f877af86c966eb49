"""Tiny random-weight models with a tokenizer trained on the spot, saved like a hub checkpoint.

No test reaches a model hub: each builds a directory with config.json,
generation_config.json, model.safetensors and a ChatML tokenizer, and the
engine's real loading code reads it.
"""

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    Ernie4_5_MoeConfig,
    Ernie4_5Config,
    Exaone4Config,
    Gemma2Config,
    Gemma3TextConfig,
    GenerationConfig,
    Glm4MoeConfig,
    GptOssConfig,
    GraniteConfig,
    Llama4TextConfig,
    LlamaConfig,
    MiniMaxM2Config,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    Olmo3Config,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    SeedOssConfig,
    SmolLM3Config,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML as Qwen writes it: tools listed in the system turn, calls as <tool_call> blocks, tool results as
# <tool_response> turns, and Qwen3's `enable_thinking=False` closing an empty think block in the prompt
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "\n<tool_call>\n{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

_CORPUS = [
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "List three countries and their capitals: Germany, Berlin; Italy, Rome; Spain, Madrid.",
    "Once upon a time, a small robot learned to write poems about the sea and the stars.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    '{"name": "Alice", "age": 30, "city": "Zürich", "tags": ["a", "b"]}',
    "Grüße aus München! Café, naïve, jalapeño, déjà vu. 日本語のテキスト。中文文本。🙂🚀",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14159 -42",
    "Question: what is 2 + 2? Answer: 4. Question: why is the sky blue? Answer: scattering.",
]

ARCHITECTURES = {
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "phi3": Phi3Config,
    "mixtral": MixtralConfig,
    "qwen2_moe": Qwen2MoeConfig,
    "qwen3_moe": Qwen3MoeConfig,
    "gemma2": Gemma2Config,
    "gemma3": Gemma3TextConfig,
    "gpt_oss": GptOssConfig,
    "granite": GraniteConfig,
    "olmo2": Olmo2Config,
    "olmo3": Olmo3Config,
    "deepseek_v2": DeepseekV2Config,
    "deepseek_v3": DeepseekV3Config,
    "glm4_moe": Glm4MoeConfig,
    "minimax_m2": MiniMaxM2Config,
    "ernie4_5": Ernie4_5Config,
    "exaone4": Exaone4Config,
    "seed_oss": SeedOssConfig,
    "ernie4_5_moe": Ernie4_5_MoeConfig,
    "smollm3": SmolLM3Config,
    "qwen3_next": Qwen3NextConfig,
    "qwen3_5": Qwen3_5TextConfig,
    "qwen3_5_moe": Qwen3_5MoeTextConfig,
    "llama4": Llama4TextConfig,
}

# config fields a family needs beyond the shared ones: no sliding window, no pad id outside the tiny
# vocabulary, and for mixtures of experts 4 experts with top-2 routing
FAMILY_FIELDS = {
    "mistral": {"sliding_window": None},
    "phi3": {"pad_token_id": None},
    "smollm3": {"pad_token_id": None},
    "olmo2": {"pad_token_id": None},
    "olmo3": {"pad_token_id": None},
    # latent attention with a q latent, 8 experts in 4 groups (the best 2 groups kept), a shared expert, the
    # first layer dense; a rotary part smaller than hidden/heads, so the two head sizes differ
    "deepseek_v3": {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
                    "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "kv_lora_rank": 56, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                    "v_head_dim": 24, "head_dim": 8, "pad_token_id": None},  # head_dim: the rotary part's, as saved
    # V2-Lite's shape: no q latent; softmax routing over 8 experts in 4 groups (the top 2 from the best group's 2)
    "deepseek_v2": {"n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "group_limited_greedy",
                    "n_group": 4, "topk_group": 1, "routed_scaling_factor": 1.5, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": None,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 24, "head_dim": 8,
                    "pad_token_id": None},
    # DeepSeek's routing over 8 experts in 2 groups, half of each head rotated, biased q/k/v, q/k norms
    "glm4_moe": {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                 "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1,
                 "attention_bias": True, "use_qk_norm": True, "pad_token_id": None},
    # 4 experts (top 2) on every layer, half of each head rotated (the released configs' `rotary_dim`)
    "minimax_m2": {"num_local_experts": 4, "num_experts_per_tok": 2, "rotary_dim": 8, "pad_token_id": None},
    "ernie4_5": {"use_bias": True, "pad_token_id": None},
    "exaone4": {"pad_token_id": None},
    "seed_oss": {"attention_bias": True, "attention_out_bias": True, "pad_token_id": None},
    # 4 experts (top 2) and a shared one on layers 2 and 3 of 3
    "ernie4_5_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                     "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "pad_token_id": None},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 96, "norm_topk_prob": False},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2},
    # linear attention (2 key heads, each with 2 value heads) and full attention with a quarter of each head
    # rotated, alternating; 4 experts (top 2) and a gated shared expert, layer 2 dense
    "qwen3_next": {"full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "mlp_only_layers": [1],
                   "pad_token_id": None},
    # Qwen3-Next's attention plan with the linear layers' projections apart; dense MLPs, or 4 experts (top 2) and
    # a gated shared expert on every layer
    # chunks of 32 positions on layers 1-3 of 4 (interleaved rotary, L2 q/k norms), layer 4 global without RoPE,
    # its queries scaled from position 8 on; 4 experts (top 1) and a shared expert on layers 2 and 4
    "llama4": {"attention_chunk_size": 32, "floor_scale": 8, "attn_scale": 0.5,
               "intermediate_size_mlp": 128, "num_local_experts": 4, "interleave_moe_layer_step": 2,
               "pad_token_id": None},
    "qwen3_5": {"full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16},
    "qwen3_5_moe": {"full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
}


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )
    # a small corpus runs out of merges: fill the vocabulary so every model token id has text
    tokenizer.add_tokens([f"<w{i}>" for i in range(vocab_size - len(tokenizer))])
    return tokenizer


def build_model_dir(
    path: Path,
    arch: str = "qwen2",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    vocab_size: int = 512,
    max_positions: int = 2048,
    tie_word_embeddings: bool = False,
    init_std: float = 0.2,
    seed: int = 0,
    tokenizer_vocab: int | None = None,
    dtype: torch.dtype = torch.float32,
    rope_theta: float | None = None,
    auto_class: type = AutoModelForCausalLM,
    **fields,
) -> Path:
    """Write a random-weight checkpoint of `arch` to `path` and return it.

    `tokenizer_vocab` caps the tokenizer below the model's vocabulary (for big benchmark shapes, where
    only token ids matter). `auto_class` is the transformers class saved: `AutoModel` the family's base model
    (`Qwen3Model`: no LM head, tensor names without the `model.` prefix), as embedding checkpoints are saved;
    `AutoModelForSequenceClassification` a classifier (`num_labels` in `fields`). `fields` are more config fields,
    over the family's `FAMILY_FIELDS`.
    """
    path = Path(path)
    tokenizer = build_tokenizer(tokenizer_vocab or vocab_size)
    # head_dim always: Mistral's config class would otherwise default it to 128
    extra = {"head_dim": hidden_size // num_heads, **FAMILY_FIELDS.get(arch, {}), **fields}
    if head_dim:
        extra["head_dim"] = head_dim
    if rope_theta:
        extra["rope_theta"] = rope_theta
    config = ARCHITECTURES[arch](
        vocab_size=max(vocab_size, len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        **extra,
    )
    torch.manual_seed(seed)
    model = auto_class.from_config(config, dtype=dtype)
    for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
        if name.endswith("e_score_correction_bias"):  # initialised to zero, where it would leave routing untested
            tensor.data.normal_(0, 0.1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=None).save_pretrained(path)
    return path


def add_vision_tower(text_dir: Path, path: Path) -> Path:
    """Write, to `path`, the text checkpoint at `text_dir` (Qwen3.5, Qwen3.5-MoE, Llama 4) as those models are
    published: inside `...ForConditionalGeneration` beside a tiny random vision tower, the config's `text_config`
    holding the text model's."""
    from transformers import AutoConfig, AutoModelForImageTextToText, Llama4Config, Qwen3_5Config, Qwen3_5MoeConfig

    text = AutoConfig.from_pretrained(text_dir)
    wrapper, vision = {
        "qwen3_5_text": (Qwen3_5Config, {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                         "out_hidden_size": text.hidden_size}),
        "qwen3_5_moe_text": (Qwen3_5MoeConfig, {"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                                "num_heads": 2, "out_hidden_size": text.hidden_size}),
        "llama4_text": (Llama4Config, {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                       "intermediate_size": 64, "vision_output_dim": 64, "projector_input_dim": 64,
                                       "projector_output_dim": text.hidden_size, "image_size": 28, "patch_size": 14}),
    }[text.model_type]
    config = wrapper(text_config=text.to_dict(), vision_config=vision, tie_word_embeddings=text.tie_word_embeddings)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32).state_dict().items():
        # the language model's tensors sit under `language_model.` (Llama 4) or `model.language_model.` (Qwen3.5)
        target = next(n for n in (f"language_model.{name}", name.replace("model.", "model.language_model.", 1), name)
                      if n in state)
        state[target] = tensor
    model.load_state_dict(state)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        (Path(path) / name).write_bytes((Path(text_dir) / name).read_bytes())
    return Path(path)


def write_sentence_transformers_modules(path: Path, pooling_mode: str, normalize: bool) -> None:
    """sentence-transformers' `modules.json` and its Pooling module's config (`pooling_mode_lasttoken`,
    `pooling_mode_mean_tokens`, ...), with a Normalize module when `normalize`, as Qwen3-Embedding ships them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, pooling_mode: True}))


def kv_cache_bytes(path: Path, num_blocks: int, block_size: int = 16) -> int:
    """The `kv_cache_bytes` budget that gives exactly `num_blocks` float32 blocks for the model at `path`."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    layers = sum(kind != "linear_attention" for kind in types)  # linear attention keeps no KV
    return num_blocks * 2 * layers * block_size * c.num_key_value_heads * head_dim * 4


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a tiny random-weight model directory (no hub needed).")
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="qwen2")
    args = parser.parse_args()
    print(build_model_dir(args.out, args.arch))


def end_answers_early(path: Path, stop_logit: float = 0.7, carrier: float = 100.0) -> None:
    """Make a tiny random Qwen2/Llama-shaped checkpoint end its answers after a few tokens, so an agent's turn
    (sent with max_tokens of tens of thousands) completes on a CPU. The last hidden dimension of the residual
    stream is made a constant carrier: every embedding holds `carrier` there and no layer writes to it, so after
    the final norm it is nearly all of the hidden state, at every position. The LM head reads it into the
    end-of-turn token's logit alone (`stop_logit` per unit), whatever the prompt; every other token keeps its
    random logit."""
    from safetensors.torch import load_file, save_file

    file = Path(path) / "model.safetensors"
    weights = load_file(file)
    eos = json.loads((Path(path) / "config.json").read_text())["eos_token_id"]
    weights["model.embed_tokens.weight"][:, -1] = carrier
    for name, tensor in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            tensor[-1] = 0.0  # the layers' outputs never reach the carrier
    head = weights["lm_head.weight"]
    head[:, -1] = 0.0
    head[eos] = 0.0
    head[eos, -1] = stop_logit
    save_file(weights, file, metadata={"format": "pt"})
