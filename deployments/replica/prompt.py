"""A conversation rendered as the model reads it: through its chat template, or gpt-oss's through harmony; chat
completions and /tokenize render with it."""

from deployments.api.chat.protocol import image_urls
from deployments.errors import OpenAIError
from runtime import AsyncLLMEngine
from runtime.text.harmony_chat import REASONING_EFFORTS, render_harmony
from runtime.text.tokenizer import render_chat


class ChatPrompt:
    def __init__(self, engine: AsyncLLMEngine, model_id: str):
        self.engine = engine
        self.model_id = model_id

    def harmony(self, req, tools, reasoning_effort: str | None = None) -> list[int]:
        """gpt-oss's prompt token ids for `req`'s conversation (a chat request's or /tokenize's): the reasoning
        effort is `reasoning_effort`, else `chat_template_kwargs`' (where gpt-oss's own chat template reads it)."""
        effort = reasoning_effort or (req.chat_template_kwargs or {}).get("reasoning_effort")
        if effort not in (None, *REASONING_EFFORTS):
            raise OpenAIError(400, f"reasoning_effort: model {self.model_id} (harmony) takes "
                              f"{', '.join(REASONING_EFFORTS)}", "reasoning_effort")
        if req.continue_final_message:
            raise OpenAIError(400, f"continue_final_message: model {self.model_id} (harmony) cannot continue a "
                              "message", "continue_final_message")
        try:
            return render_harmony([m.template_dict() for m in req.messages],
                                  [t.model_dump(exclude_none=True) for t in tools] if tools else None, effort,
                                  req.add_generation_prompt)
        except (ValueError, KeyError, TypeError) as e:  # a tool result with no call, a malformed tool call
            raise OpenAIError(400, f"messages: harmony could not render them: {e!r}", "messages") from e

    def render(self, req) -> str:
        """The conversation as the chat template writes it; `req` has a chat request's `messages`, `tools`,
        `chat_template_kwargs`, `add_generation_prompt` and `continue_final_message` (/tokenize's has too)."""
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None

        def render(as_parts: bool) -> str:
            return render_chat(self.engine.tokenizer, [m.template_dict(as_parts) for m in req.messages], tools,
                               req.chat_template_kwargs, req.add_generation_prompt, req.continue_final_message)

        try:
            try:  # a vision-language model's template reads content as parts (transformers' processors' format)
                return render(self.engine.validator.takes_images)
            except Exception:
                if not self.engine.validator.takes_images or image_urls(req.messages):
                    raise
                return render(False)  # a fine-tune whose template reads content as text, on a conversation of text
        except Exception as e:  # the template rejected the conversation (jinja raise_exception, bad kwargs)
            raise OpenAIError(400, f"messages: the chat template could not render them: {e}", "messages") from e
