"""Which implementation runs a checkpoint: its config's `architectures`, mapped to one class per family (and
the family's base model, which embedding checkpoints name, and its sequence classifier)."""

from transformers import PretrainedConfig

from runtime.errors import InvalidInputError
from runtime.models.classifier import classifier_of
from runtime.models.decoder import CausalLM
from runtime.models.deepseek_v2 import DeepseekV2ForCausalLM
from runtime.models.deepseek_v3 import DeepseekV3ForCausalLM
from runtime.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM, Ernie4_5ForCausalLM
from runtime.models.exaone4 import Exaone4ForCausalLM
from runtime.models.gemma2 import Gemma2ForCausalLM
from runtime.models.gemma3 import Gemma3ForCausalLM
from runtime.models.gemma3_vl import Gemma3ForConditionalGeneration
from runtime.models.glm4_moe import Glm4MoeForCausalLM
from runtime.models.gpt_oss import GptOssForCausalLM
from runtime.models.granite import GraniteForCausalLM
from runtime.models.llama import LlamaForCausalLM
from runtime.models.llama4 import Llama4ForCausalLM
from runtime.models.llama4_vl import Llama4ForConditionalGeneration
from runtime.models.llava import LLAVA_FAMILIES
from runtime.models.minimax_m2 import MiniMaxM2ForCausalLM
from runtime.models.mistral import MistralForCausalLM
from runtime.models.mistral3 import Mistral3ForConditionalGeneration
from runtime.models.mixtral import MixtralForCausalLM
from runtime.models.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from runtime.models.phi3 import Phi3ForCausalLM
from runtime.models.qwen2 import Qwen2ForCausalLM
from runtime.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
from runtime.models.qwen2_moe import Qwen2MoeForCausalLM
from runtime.models.qwen3 import Qwen3ForCausalLM
from runtime.models.qwen3_5 import (
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)
from runtime.models.qwen3_moe import Qwen3MoeForCausalLM
from runtime.models.qwen3_next import Qwen3NextForCausalLM
from runtime.models.qwen3_vl import Qwen3VLForConditionalGeneration
from runtime.models.seed_oss import SeedOssForCausalLM
from runtime.models.smollm3 import SmolLM3ForCausalLM


def _base_model(family: type[CausalLM]) -> type[CausalLM]:
    """The family's base model without an LM head (`Qwen3Model`: what Qwen3-Embedding is saved as)."""
    name = family.__name__.removesuffix("ForCausalLM") + "Model"
    return type(name, (family,), {"headless": True, "bare_names": True})


# families whose base model serves embeddings and whose classifier scores (Gemma's embedding models attend both
# ways: not built)
_EMBEDDABLE = (LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM,
               Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)
_CAUSAL_LMS = (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM,
               Exaone4ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration,
               Glm4MoeForCausalLM, GptOssForCausalLM,
               GraniteForCausalLM, Llama4ForCausalLM, Llama4ForConditionalGeneration, MiniMaxM2ForCausalLM,
               Mistral3ForConditionalGeneration,
               Olmo2ForCausalLM, Olmo3ForCausalLM, Qwen2VLForConditionalGeneration,
               Qwen2_5_VLForConditionalGeneration, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
               Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM,
               Qwen3VLForConditionalGeneration, SeedOssForCausalLM, SmolLM3ForCausalLM, *_EMBEDDABLE)
_FAMILIES: dict[str, type[CausalLM]] = {
    cls.__name__: cls for cls in (*_CAUSAL_LMS, *map(_base_model, _EMBEDDABLE), *map(classifier_of, _EMBEDDABLE))}


# vision-language architectures whose class follows their language model's family (its `model_type`)
_BY_LANGUAGE_MODEL: dict[str, dict[str, type[CausalLM]]] = {"LlavaForConditionalGeneration": LLAVA_FAMILIES}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(sorted([*_FAMILIES, *_BY_LANGUAGE_MODEL]))


def model_class(config: PretrainedConfig) -> type[CausalLM]:
    """The class for the config's architecture; an InvalidInputError naming it (and what is supported) if none."""
    names = getattr(config, "architectures", None) or []
    for name in names:
        if name in _FAMILIES:
            return _FAMILIES[name]
        if name in _BY_LANGUAGE_MODEL:
            families, language = _BY_LANGUAGE_MODEL[name], config.text_config.model_type
            if language not in families:
                raise InvalidInputError("model", f"{name} with a {language} language model is not supported; "
                                        f"supported: {', '.join(sorted(families))}")
            return families[language]
    raise InvalidInputError("model", f"architecture {', '.join(names) or '(none in config.json)'} is not "
                            f"supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
