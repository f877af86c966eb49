"""The offline API for scripts and benchmarks: `LLM(model).generate(prompts, params)`, `LLM(model).embed(prompts)`,
and a classifier's `classify` and `score`."""

import itertools
from dataclasses import replace

from runtime.engine.llm_engine import LLMEngine
from runtime.errors import require
from runtime.lora import LoRARequest
from runtime.multimodal import ImageInput
from runtime.multimodal.chat import split_pictures
from runtime.outputs import RequestOutput
from runtime.pooling import label_probabilities
from runtime.sampling_params import SamplingParams
from runtime.scoring import ScoringPlan
from runtime.text.harmony_chat import render_harmony, stop_token_ids, uses_harmony
from runtime.text.tokenizer import render_chat

# text, token ids, or (as vLLM takes pictures) {"prompt": text with a placeholder per picture,
# "multi_modal_data": {"image": a PIL image or a list of them}}
Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str, **engine_kwargs):
        self.engine = LLMEngine.from_options(model, **engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def stats(self) -> dict:
        """The engine's counters: blocks, preemptions, prefix-cache hits and, with speculation, its figures."""
        return self.engine.stats()

    def shutdown(self) -> None:
        """Release tensor-parallel workers (nothing to do at TP=1)."""
        self.engine.shutdown()

    # the lifecycle between rollouts (runtime.engine.lifecycle); nothing is in flight between two generate calls

    def sleep(self) -> None:
        """Release the weights and the KV cache until `wake_up`."""
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def update_weights(self, model_path: str, weight_version: str | None = None) -> None:
        """Load new weights: a checkpoint of this model's architecture and shapes (named `weight_version`)."""
        self.engine.update_weights(model_path, weight_version)

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; one output per prompt, in order. `lora_request` names the LoRA
        adapter (one for all prompts, or one per prompt; the engine needs `enable_lora=True`)."""
        if self.engine.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        if not isinstance(params, list):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"params: {len(params)} given for {len(prompts)} prompts")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"lora_request: {len(loras)} given for {len(prompts)} prompts")
        outputs: dict[str, RequestOutput] = {}
        try:
            for prompt, p, lora in zip(prompts, params, loras):
                text, ids, images = self._prompt(prompt)
                request_id = f"llm-{next(self._ids)}"
                self.engine.add_request(request_id, ids, p, lora=lora, stream=False, images=images)
                outputs[request_id] = RequestOutput.empty(request_id, ids, p.n, text)
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    outputs[delta.request_id].add(delta)
        except BaseException:
            for request_id in outputs:
                self.engine.abort(request_id)
            raise
        return list(outputs.values())

    def _prompt(self, prompt: Prompt) -> tuple[str | None, list[int], tuple[ImageInput, ...]]:
        """A prompt's text (if given), token ids and pictures' inputs."""
        if isinstance(prompt, str):
            return prompt, self.engine.validator.encode(prompt), ()
        if not isinstance(prompt, dict):
            return None, prompt, ()
        if "images" in prompt:  # processed already (`chat`)
            return None, prompt["prompt_token_ids"], prompt["images"]
        pictures = prompt.get("multi_modal_data", {}).get("image", [])
        pictures = pictures if isinstance(pictures, list) else [pictures]
        ids, images = self.engine.validator.process_images(prompt["prompt"], pictures, param="prompt")
        return prompt["prompt"], ids, images

    def embed(self, prompts: Prompt | list[Prompt]) -> list[list[float]]:
        """Each prompt's embedding (its final hidden states pooled as the engine's `pooler_config` says), in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        embeddings: dict[str, list[float] | None] = {}
        try:
            for prompt in prompts:
                ids = self.engine.validator.encode(prompt) if isinstance(prompt, str) else prompt
                request_id = f"llm-{next(self._ids)}"
                self.engine.enqueue(request_id, self.engine.validator.validate_embedding(ids))
                embeddings[request_id] = None
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    embeddings[delta.request_id] = delta.embedding
        except BaseException:
            for request_id in embeddings:
                self.engine.abort(request_id)
            raise
        return list(embeddings.values())

    def classify(self, prompts: Prompt | list[Prompt]) -> list[list[float]]:
        """Each prompt's label probabilities, in the order of the classifier's labels (`engine.spec.labels`)."""
        spec = self.engine.spec
        require(spec.labels is not None, "model", f"{spec.model_class.__name__} is not a classifier")
        return [label_probabilities(logits) for logits in self.embed(prompts)]

    def score(self, first: str | list[str], second: str | list[str]) -> list[float]:
        """`first` scored against each of `second` (one text against many, or pair by pair): a one-label
        classifier's probability for each pair, or an embedding model's cosine (`runtime.scoring`)."""
        spec = self.engine.spec
        plan = ScoringPlan.make(self.tokenizer, spec.hf_config, spec.labels, *(
            [texts] if isinstance(texts, str) else list(texts) for texts in (first, second)))
        return plan.scores(self.embed(plan.prompts))

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | list[SamplingParams] | None = None,
        chat_template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the chat template; gpt-oss's through
        harmony (`chat_template_kwargs` may name its `reasoning_effort`), stopping at `<|return|>` or `<|call|>`."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if uses_harmony(self.engine.spec.hf_config):
            effort = (chat_template_kwargs or {}).get("reasoning_effort")
            prompts = [render_harmony(c, tools, effort) for c in conversations]
            stops = stop_token_ids()
            params = [replace(p, stop_token_ids=[*p.stop_token_ids, *stops])
                      for p in (params if isinstance(params, list) else [params or SamplingParams()] * len(prompts))]
        else:
            validator, prompts = self.engine.validator, []
            for conversation in conversations:
                messages, pictures = split_pictures(conversation, validator.takes_images)
                text = render_chat(self.tokenizer, messages, tools, chat_template_kwargs)
                ids, images = validator.process_images(text, pictures, add_special_tokens=False)
                prompts.append({"prompt_token_ids": ids, "images": images} if images else ids)
        return self.generate(prompts, params, lora_request)
