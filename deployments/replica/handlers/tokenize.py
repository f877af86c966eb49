"""vLLM's /tokenize and /detokenize on one replica: a prompt, or a conversation through the model's chat
template (gpt-oss's through harmony), as the model's token ids; and token ids back to text."""

from collections.abc import Awaitable, Callable

from deployments.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from deployments.errors import OpenAIError
from deployments.replica.prompt import ChatPrompt
from deployments.work_pool import off_loop
from runtime import AsyncLLMEngine


class TokenizeHandler:
    def __init__(self, engine: AsyncLLMEngine, prompt: ChatPrompt, pictures: Callable[[list], Awaitable[list]]):
        """`pictures(messages)`: the pictures a conversation names, read (`ChatHandler.pictures`)."""
        self.engine = engine
        self.prompt = prompt
        self.pictures = pictures

    async def tokenize(self, req: TokenizeRequest) -> dict:
        pictures = await self.pictures(req.messages) if req.messages is not None else []
        return await off_loop(self._tokenize, req, pictures)

    def _tokenize(self, req: TokenizeRequest, pictures: list) -> dict:
        """The ids a chat completion is given: a picture's tokens counted as its processor spells them out."""
        special = req.add_special_tokens if req.add_special_tokens is not None else req.messages is None
        if req.messages is not None and self.engine.harmony:  # gpt-oss: the ids its chat completions are given
            ids = self.prompt.harmony(req, req.tools)
        else:
            text = req.prompt if req.messages is None else self.prompt.render(req)
            if self.engine.validator.takes_images:
                ids, _ = self.engine.validator.process_images(text, pictures, special)
            else:
                ids = self.engine.encode(text, add_special_tokens=special)
        strs = self.engine.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        limit, vocab = self.engine.max_model_len, len(self.engine.tokenizer)
        if len(req.tokens) > limit:
            raise OpenAIError(400, f"tokens: at most {limit} (this model's context length), got {len(req.tokens)}",
                              "tokens")
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise OpenAIError(400, f"tokens: {bad} is not a token id of this model (0 to {vocab - 1})", "tokens")
        return {"prompt": await off_loop(self.engine.tokenizer.decode, req.tokens)}
