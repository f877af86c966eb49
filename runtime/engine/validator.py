"""What a request must pass before it reaches the engine, and what checking it needs: the model's spec and
tokenizer, LoRA adapters read from disk, structured-output grammars compiled.

Every engine holds one (`engine.validator`), and callers check requests with it before they queue them: an
`LLMEngine` in the caller's process, or an `EngineProcess`, whose validator loads no weights (the model's are in
the child process).
"""

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from PIL import Image
from transformers import PreTrainedTokenizerBase

from runtime.config import EngineConfig
from runtime.errors import ContextLengthError, InvalidInputError, describe, require
from runtime.lora import LoRAAdapter, LoRARequest, load_adapter
from runtime.models.spec import ModelSpec
from runtime.multimodal import ImageInput, ImageProcessing
from runtime.pooling import PoolerConfig
from runtime.sampling_params import SamplingParams
from runtime.text.grammar import Constraint, Grammar, GrammarCompiler
from runtime.text.tokenizer import TokenCountBound, encode, eos_token_ids, load_tokenizer

logger = logging.getLogger(__name__)

_EMBEDDING_PARAMS = SamplingParams(max_tokens=None)  # an embedding request samples nothing


@dataclass(frozen=True)
class ValidRequest:
    """A prompt and its sampling options as `RequestValidator.validate` accepted them."""

    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved against the context
    grammar: Grammar | None = None  # the structured-output constraint, when compiled ahead of queueing
    adapter: LoRAAdapter | None = None  # the LoRA adapter it runs with, read and checked
    pooling: PoolerConfig | None = None  # an embedding request: how its hidden states are pooled
    images: tuple[ImageInput, ...] = ()  # the prompt's pictures (`RequestValidator.process_images`)
    # a router's labels for its prompt's prefixes, reported while the engine holds them (runtime.core.prefix_marks)
    prefix_marks: tuple[int, ...] = ()

    @property
    def adapter_name(self) -> str | None:
        """What its prefix blocks' hash chain starts from beside the weights (`BlockManager.chain_start`)."""
        return self.adapter.name if self.adapter is not None else None


class RequestValidator:
    def __init__(self, config: EngineConfig, isolate_grammars: bool = True):
        """`isolate_grammars=False`: constraints compile without compile processes (see GrammarCompiler)."""
        self.config = config
        self._isolate_grammars = isolate_grammars
        self.spec = ModelSpec.resolve(config)
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(self.spec.tokenizer)
        self.eos_token_ids = eos_token_ids(self.spec.path, self.tokenizer)
        self.token_count_bound = TokenCountBound(self.tokenizer)
        # how pooling requests pool
        self.pooler = config.pooler_config.resolve(self.spec.path, self.spec.model_class.classifies)
        self.images = None  # a vision-language model's processor: pictures in prompts
        if self.spec.takes_images:
            try:
                self.images = ImageProcessing(self.spec.path, self.spec.model_class,
                                              self.spec.hf_config.vision_language, config.mm_processor_kwargs)
            except OSError as e:  # a checkpoint saved without its processor's files
                logger.warning("%s has no image processor (%s): it is served text-only", self.spec.path, e)
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()
        self._adapters: OrderedDict[tuple[str, str], LoRAAdapter] = OrderedDict()  # read adapters, LRU
        self._adapters_lock = threading.Lock()  # validate runs on the callers' threads

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids; a text that cannot fit the context by a cheap bound is refused untokenized."""
        limit = self.spec.max_model_len
        try:
            fewest = self.token_count_bound.fewest_tokens(text)
        except UnicodeEncodeError as e:  # a lone surrogate, which no tokenizer takes
            raise InvalidInputError("prompt", f"not valid Unicode: {e.reason} at character {e.start}") from None
        if fewest >= limit:
            raise ContextLengthError("prompt", f"this model's maximum context length is {limit} tokens, and the "
                                     f"prompt has at least {fewest} tokens", fewest, None, limit)
        return encode(self.tokenizer, text, add_special_tokens)

    @property
    def takes_images(self) -> bool:
        """The model serves pictures: a vision-language model, with its processor, not served text-only."""
        return self.images is not None

    @property
    def images_per_prompt(self) -> int:
        return self.config.limit_mm_per_prompt["image"]

    def process_images(self, text: str, images: list[Image.Image], add_special_tokens: bool = True,
                       param: str = "messages") -> tuple[list[int], tuple[ImageInput, ...]]:
        """A prompt's text with a placeholder per picture (the processor's `placeholder`), as token ids with each
        picture's tokens spelled out, and the pictures' inputs (`validate` takes both)."""
        require(self.images is not None or not images, param,
                f"this model does not take images ({self.spec.model_class.__name__}"
                f"{' served text-only' if self.spec.model_class.takes_images else ''})")
        limit = self.images_per_prompt
        require(len(images) <= limit, param, f"{len(images)} images, over the {limit} a prompt may hold "
                "(limit_mm_per_prompt)")
        if not images:
            return self.encode(text, add_special_tokens), ()
        try:
            return self.images.process(text, images, add_special_tokens)
        except ValueError as e:
            raise InvalidInputError(param, str(e)) from None
        except Exception as e:  # the processor refused a picture otherwise (a mode or size it cannot take)
            raise InvalidInputError(param, f"the images could not be processed: {describe(e)}") from None

    def validate(self, prompt_token_ids: list[int], params: SamplingParams,
                 lora: LoRARequest | None = None, images: tuple[ImageInput, ...] = ()) -> ValidRequest:
        """Check a generation request against the model and context (`validate_embedding` checks embedding
        requests). A LoRA adapter is read from disk here, off the engine's thread when the caller is."""
        family = self.spec.model_class
        require(not family.headless, "model",
                f"{family.__name__} has no LM head: it only {'scores' if family.classifies else 'embeds'}")
        adapter = self._adapter(lora)
        limit = self.spec.max_model_len
        n = len(prompt_token_ids)
        if n >= limit:
            raise ContextLengthError("prompt", f"this model's maximum context length is {limit} tokens, and the "
                                     f"prompt has {n} tokens; at least one token must be left for the completion",
                                     n, None, limit)
        self._check_prompt(prompt_token_ids)
        vocab = self.spec.vocab_size
        for field, ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            require(bad is None, field, f"token id {bad} is outside the vocabulary [0, {vocab})")
        if params.max_tokens is None:  # up to the context's end, which min_tokens must fit in (as vLLM)
            require(params.min_tokens <= limit - n, "min_tokens",
                    f"({params.min_tokens}) must not exceed the {limit - n} tokens the context leaves after the "
                    f"prompt's {n} (this model's maximum context length is {limit})")
            return ValidRequest(list(prompt_token_ids), params, limit - n, adapter=adapter, images=images)
        if n + params.max_tokens > limit:
            raise ContextLengthError("max_tokens", f"this model's maximum context length is {limit} tokens; the "
                                     f"prompt has {n} tokens and max_tokens is {params.max_tokens}, "
                                     f"{n + params.max_tokens} in total", n, params.max_tokens, limit)
        return ValidRequest(list(prompt_token_ids), params, params.max_tokens, adapter=adapter, images=images)

    def validate_embedding(self, prompt_token_ids: list[int], lora: LoRARequest | None = None) -> ValidRequest:
        """An embedding request checked against the model: its prompt may fill the whole context."""
        adapter = self._adapter(lora)
        limit = self.spec.max_model_len
        require(len(prompt_token_ids) <= limit, "input",
                f"this model's maximum context length is {limit} tokens, and the input has {len(prompt_token_ids)}")
        self._check_prompt(prompt_token_ids, "input")
        return ValidRequest(list(prompt_token_ids), _EMBEDDING_PARAMS, 0, adapter=adapter, pooling=self.pooler)

    def _check_prompt(self, prompt_token_ids: list[int], param: str = "prompt") -> None:
        require(len(prompt_token_ids) > 0, param, "must not be empty")
        vocab = self.spec.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        require(bad is None, param, f"token id {bad} is outside the vocabulary [0, {vocab})")

    def _adapter(self, lora: LoRARequest | None) -> LoRAAdapter | None:
        if lora is None:
            return None
        require(self.config.enable_lora, "model", "this engine serves no LoRA adapters (enable_lora)")
        return self._read_adapter(lora)

    def _read_adapter(self, lora: LoRARequest) -> LoRAAdapter:
        """An adapter read once and kept while recently used (adapters are immutable by name and path)."""
        key = (lora.name, lora.path)
        with self._adapters_lock:
            adapter = self._adapters.get(key)
            if adapter is not None:
                self._adapters.move_to_end(key)
                return adapter
        adapter = load_adapter(lora, self.spec.hf_config, self.config.max_lora_rank)
        with self._adapters_lock:
            self._adapters[key] = adapter
            while len(self._adapters) > 4 * self.config.max_loras:
                self._adapters.popitem(last=False)
        return adapter

    def compile_grammar(self, constraint: Constraint, timeout_s: float | None = None) -> Grammar:
        """Compile a structured-output constraint (cached); thread-safe, so callers may do it off-loop. TimeoutError
        when it did not compile within `timeout_s` (its compile process is killed)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.spec.vocab_size, self.eos_token_ids,
                                                 self._isolate_grammars)
        return self._grammars.compile(constraint, timeout_s)

    def cached_grammar(self, constraint: Constraint) -> Grammar | None:
        """The constraint's grammar if it is compiled and kept: answered at once, whatever compiles meanwhile."""
        return None if self._grammars is None else self._grammars.cached(constraint)

    def close(self) -> None:
        """Stop the grammar compile processes, if any."""
        if self._grammars is not None:
            self._grammars.close()
