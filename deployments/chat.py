"""/v1/chat/completions on one replica: render the conversation, generate, shape the reply."""

from collections.abc import AsyncIterator

from deployments.errors import OpenAIError
from deployments.openai_format import TokenTexts, chat_logprobs, usage
from deployments.protocol import ChatCompletionRequest
from deployments.streams import SSE_DONE, now, sse
from runtime import AsyncLLMEngine, CompletionOutput, RequestOutput
from runtime.tokenizer import encode, render_chat


class ChatHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str, texts: TokenTexts):
        self.engine = engine
        self.model_id = model_id
        self.texts = texts

    def prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        tokenizer = self.engine.tokenizer
        messages = [m.template_dict() for m in req.messages]
        try:
            text = render_chat(tokenizer, messages, None, req.chat_template_kwargs,
                               add_generation_prompt=req.add_generation_prompt and not req.continue_final_message)
        except Exception as e:  # the template rejected the conversation (jinja raise_exception, bad kwargs)
            raise OpenAIError(400, f"messages: the chat template could not render them: {e}", "messages") from e
        return encode(tokenizer, text, add_special_tokens=False)

    async def complete(self, req: ChatCompletionRequest, request_id: str, priority: int = 0) -> dict:
        params = req.to_sampling_params()
        prompt = self.prompt_ids(req)
        result = RequestOutput(request_id, None, prompt, outputs=[CompletionOutput(i) for i in range(params.n)])
        async for delta in self.engine.generate(prompt, params, request_id, priority):
            result.add(delta)
        choices = [self._choice(c, req.logprobs) for c in result.outputs]
        completion_tokens = sum(len(c.token_ids) for c in result.outputs)
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": now(),
            "model": self.model_id,
            "choices": choices,
            "usage": usage(len(prompt), completion_tokens, result.num_cached_tokens),
        }

    def _choice(self, c: CompletionOutput, want_logprobs: bool) -> dict:
        return {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text, "reasoning_content": None, "tool_calls": None},
            "logprobs": chat_logprobs(c.logprobs or [], self.texts) if want_logprobs else None,
            "finish_reason": c.finish_reason,
            "matched_stop": c.matched_stop,
        }

    async def stream(self, req: ChatCompletionRequest, request_id: str) -> AsyncIterator[str]:
        """Prepare (errors raise before the first chunk), then stream SSE chunks."""
        params = req.to_sampling_params()
        prompt = self.prompt_ids(req)
        self.engine.validate(prompt, params)
        generator = self.engine.generate(prompt, params, request_id)
        return self._chunks(req, request_id, prompt, params.n, generator)

    async def _chunks(self, req, request_id, prompt, n, generator) -> AsyncIterator[str]:
        created = now()

        def chunk(choices: list[dict], **extra) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_id, "choices": choices, **extra})

        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        completion_tokens, cached = 0, 0
        async for delta in generator:
            cached = delta.num_cached_tokens
            for s in delta.seqs:
                if s.text or (req.logprobs and s.logprobs):
                    logprobs = chat_logprobs(s.logprobs, self.texts) if req.logprobs else None
                    yield chunk([{"index": s.index, "delta": {"content": s.text}, "logprobs": logprobs,
                                  "finish_reason": None}])
                if s.finish_reason is not None:
                    completion_tokens += s.num_output_tokens
                    yield chunk([{"index": s.index, "delta": {}, "logprobs": None,
                                  "finish_reason": s.finish_reason, "matched_stop": s.matched_stop}])
        if req.include_usage:
            yield chunk([], usage=usage(len(prompt), completion_tokens, cached))
        yield SSE_DONE
