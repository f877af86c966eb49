"""/v1/chat/completions on one replica: render the conversation, generate, shape the reply.

When the model has a reasoning parser (and the request keeps `separate_reasoning`),
`<think>…</think>` goes to `reasoning_content`; when the request offers tools
and the model has a tool-call parser, the calls it writes (in its family's format:
deployments/parsers/tool_formats.py) become `tool_calls`.
gpt-oss chats in harmony instead: the prompt is rendered and the output parsed
by openai-harmony, its analysis channel being the reasoning.
"""

from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

from PIL import Image

from deployments.api.chat.protocol import ChatCompletionRequest, ChatMessage, image_urls
from deployments.api.format import TokenTexts, chat_logprobs, chunk_builder, now, prompt_logprobs_json, usage
from deployments.api.request_model import engine_priority
from deployments.errors import OpenAIError
from deployments.media import MediaLoader, MediaPolicy
from deployments.parsers import FORCED_CALL_FORMAT, REASONING_PARSERS, TOOL_CALL_FORMATS
from deployments.replica.adapters import ModelAdapters
from deployments.replica.choice_parser import ChoiceParser, HarmonyChoiceParser, tool_call_json
from deployments.replica.encoder_server import EncoderClient
from deployments.replica.prompt import ChatPrompt
from deployments.route_marks import marked
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine, CompletionOutput, RequestOutput, ValidRequest
from runtime.text.harmony_chat import stop_token_ids

PROMPT_TAIL_TOKENS = 16  # enough to hold a reasoning tag the template wrote at the prompt's end


class ChatHandler:
    def __init__(self, engine: AsyncLLMEngine, model_id: str, texts: TokenTexts, adapters: ModelAdapters,
                 reasoning_parser: str | None = None, tool_call_parser: str | None = None,
                 media: MediaLoader | None = None, encoder: EncoderClient | None = None):
        self.engine = engine
        self.media = media or MediaLoader(MediaPolicy())  # by default: data: URLs only
        self.encoder = encoder  # None: the engine encodes pictures itself
        self.adapters = adapters
        self.model_id = model_id
        self.texts = texts
        self.reasoning_parser = reasoning_parser
        self.tool_call_parser = tool_call_parser
        self.prompt = ChatPrompt(engine, model_id)
        self.harmony = engine.harmony

    async def pictures(self, messages: list[ChatMessage]) -> list[Image.Image]:
        """The pictures a conversation names, read and decoded (a text-only model is told so before any read)."""
        urls = image_urls(messages)
        if not urls:
            return []
        if not self.engine.validator.takes_images:
            raise OpenAIError(400, f"{urls[0][1]}: model {self.model_id} does not take images", urls[0][1])
        limit = self.engine.validator.images_per_prompt
        if len(urls) > limit:  # told before a picture is read
            raise OpenAIError(400, f"messages: {len(urls)} images, over the {limit} a prompt may hold "
                              "(limit_mm_per_prompt)", "messages")
        return await self.media.images(urls)

    async def _valid(self, req: ChatCompletionRequest, priority: int = 0) -> ValidRequest:
        """The request prepared off the loop, its pictures encoded by the model's encoder deployment where it has
        one."""
        valid = await off_loop(self._prepare, req, await self.pictures(req.messages), priority=priority)
        if not valid.images or self.encoder is None:
            return valid
        cached = await off_loop(self.engine.engine.cached_prompt_tokens, valid)  # those pictures need no encoding
        return replace(valid, images=await self.encoder.encode(valid.images, cached))

    def _prepare(self, req: ChatCompletionRequest, images: list[Image.Image]) -> ValidRequest:
        """Called on a worker thread: chat templates, tokenizing and image processing never hold up the replica's
        event loop."""
        pictures = ()
        if self.harmony:
            prompt = self._render_harmony(req)
            params = req.to_sampling_params()
            params.stop_token_ids += stop_token_ids()
        else:
            if req.uses_tools and self.tool_call_parser is None:
                raise OpenAIError(400, f"tools: model {self.model_id} has no tool_call_parser configured", "tools")
            params = req.to_sampling_params()
            tool_format = self._tool_format_name(req)
            if tool_format is not None and TOOL_CALL_FORMATS[tool_format].special_tokens:
                params.skip_special_tokens = False  # the calls' tags must reach the parser
            if self.engine.validator.takes_images:
                prompt, pictures = self.engine.validator.process_images(self.prompt.render(req), images,
                                                              add_special_tokens=False)
            else:
                prompt = self.engine.encode(self.prompt.render(req), add_special_tokens=False)
        return marked(self.engine.validate(prompt, params, self.adapters.request_for(req.model), pictures), req)

    def _render_harmony(self, req: ChatCompletionRequest) -> list[int]:
        """gpt-oss's prompt token ids. A grammar (a forced tool choice, a structured output) would constrain the
        channels and headers too: refused."""
        constraint = req.tool_constraint() or req.constraint()
        if constraint is not None:
            raise OpenAIError(400, f"{constraint.param}: model {self.model_id} (harmony) takes no grammar on its "
                              "output", constraint.param)
        tools = req.tools if req.uses_tools else None
        return self.prompt.harmony(req, tools, req.reasoning_effort)

    def _parsers(self, req: ChatCompletionRequest, prompt: list[int],
                 n: int) -> list[ChoiceParser | HarmonyChoiceParser]:
        """A parser for each of the `n` choices; what they share is read once: whether the prompt opened or closed
        a reasoning block, and the calls' format."""
        if self.harmony:
            return [HarmonyChoiceParser(req.separate_reasoning) for _ in range(n)]
        reasoning = None
        if self.reasoning_parser and req.separate_reasoning:
            tail = self.engine.tokenizer.decode(prompt[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
            reasoning = partial(REASONING_PARSERS[self.reasoning_parser], tail)
        name = self._tool_format_name(req)
        schemas = {t.function.name: t.function.parameters for t in req.tools or []}
        tool_format = TOOL_CALL_FORMATS[name](schemas) if name else None  # read-only: the choices share it
        return [ChoiceParser(reasoning() if reasoning else None, tool_format, self.engine.tokenizer,
                             req.parallel_tool_calls) for _ in range(n)]

    def _tool_format_name(self, req: ChatCompletionRequest) -> str | None:
        """The format of the output's calls: the forcing grammar's for a forced tool choice, else the model's."""
        if not req.uses_tools:
            return None
        return self.tool_call_parser if req.tool_choice == "auto" else FORCED_CALL_FORMAT

    async def complete(self, req: ChatCompletionRequest, request_id: str, priority: int = 0,
                       owner: str | None = None) -> dict:
        valid = await self._valid(req, priority)
        prompt = valid.prompt_token_ids
        result = RequestOutput.empty(request_id, prompt, valid.params.n)
        async for delta in self.engine.generate(valid, request_id, engine_priority(priority, req.priority), owner,
                                                stream=False):
            result.add(delta)
        parsers = self._parsers(req, prompt, len(result.outputs))
        choices = [self._choice(c, parser, req) for c, parser in zip(result.outputs, parsers)]
        completion_tokens = sum(len(c.token_ids) for c in result.outputs)
        reasoning_tokens = sum(p.reasoning_tokens for p in parsers)
        reply = {
            "id": request_id,
            "object": "chat.completion",
            "created": now(),
            "model": self.adapters.model_name(req.model),
            "choices": choices,
            "usage": usage(len(prompt), completion_tokens, result.num_cached_tokens, reasoning_tokens),
        }
        # always present (null when not asked): vLLM's clients read it
        reply["prompt_logprobs"] = (prompt_logprobs_json(result.prompt_logprobs or [], self.texts)
                                    if req.prompt_logprobs is not None else None)
        if req.return_token_ids:
            reply["prompt_token_ids"] = prompt
        return reply

    def _choice(self, c: CompletionOutput, parser: ChoiceParser, req: ChatCompletionRequest) -> dict:
        parsed = parser.feed(c.text, c.token_ids, final=True)
        calls = [tool_call_json(i, call) for i, call in enumerate(parsed.tool_calls)]
        for call in calls:
            del call["index"]
        content = parsed.content
        if calls and not content.strip():
            content = None
        message = {"role": "assistant", "content": content, "refusal": None,
                   "reasoning_content": parsed.reasoning or None}
        if calls:  # absent when there are none, as OpenAI sends it
            message["tool_calls"] = calls
        choice = {
            "index": c.index,
            "message": message,
            "logprobs": chat_logprobs(c.logprobs or [], self.texts) if req.logprobs else None,
            "finish_reason": _finish_reason(c.finish_reason, parser),
            "matched_stop": c.matched_stop,
        }
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
        return choice

    async def stream(self, req: ChatCompletionRequest, request_id: str,
                     owner: str | None = None) -> AsyncIterator[dict]:
        """Prepare (errors raise before the first chunk), then stream the chunks."""
        # a bad picture or grammar: refused before streaming
        valid = await self.engine.compile(await self._valid(req))
        generator = self.engine.generate(valid, request_id, engine_priority(0, req.priority), owner)
        return self._chunks(req, request_id, valid.prompt_token_ids, valid.params.n, generator)

    async def _chunks(self, req, request_id, prompt, n, generator) -> AsyncIterator[dict]:
        chunk = chunk_builder(request_id, "chat.completion.chunk", self.adapters.model_name(req.model))
        parsers = self._parsers(req, prompt, n)
        calls_sent = [0] * n
        generated, cached = 0, 0  # tokens so far, for usage on every chunk (continuous_usage_stats)

        def extra() -> dict:
            return {"usage": usage(len(prompt), generated, cached)} if req.usage_on_every_chunk else {}

        first = {"prompt_token_ids": prompt} if req.return_token_ids else {}
        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                          "logprobs": None, "finish_reason": None}], **first, **extra())
        completion_tokens = 0
        async for delta in generator:
            cached = delta.num_cached_tokens
            for s in delta.seqs:
                generated += len(s.token_ids)
                parser = parsers[s.index]
                parsed = parser.feed(s.text, s.token_ids, s.finish_reason is not None)
                logprobs = chat_logprobs(s.logprobs, self.texts) if req.logprobs and s.logprobs else None
                token_ids = {"token_ids": s.token_ids} if req.return_token_ids else {}
                if parsed or logprobs or (token_ids and s.token_ids):
                    message = {"reasoning_content": parsed.reasoning or None}  # null, not absent, as SGLang sends
                    if parsed.content or not parsed:
                        message["content"] = parsed.content
                    if parsed.tool_calls:
                        message["tool_calls"] = [tool_call_json(calls_sent[s.index] + k, call)
                                                 for k, call in enumerate(parsed.tool_calls)]
                        calls_sent[s.index] += len(parsed.tool_calls)
                    yield chunk([{"index": s.index, "delta": message, "logprobs": logprobs, "finish_reason": None,
                                  **token_ids}], **extra())
                if s.finish_reason is not None:
                    completion_tokens += s.num_output_tokens
                    yield chunk([{"index": s.index, "delta": {"reasoning_content": None}, "logprobs": None,
                                  "finish_reason": _finish_reason(s.finish_reason, parser),
                                  "matched_stop": s.matched_stop}], **extra())
        if req.include_usage:
            reasoning_tokens = sum(p.reasoning_tokens for p in parsers)
            yield chunk([], usage=usage(len(prompt), completion_tokens, cached, reasoning_tokens))


def _finish_reason(reason: str | None, parser: ChoiceParser) -> str | None:
    return "tool_calls" if reason == "stop" and parser.made_tool_calls else reason
