"""The request bodies of vLLM's /tokenize and /detokenize."""

from typing import Any

from pydantic import Field, model_validator

from deployments.api.chat.protocol import ChatMessage, Tool
from deployments.api.request_model import RequestModel


class TokenizeRequest(RequestModel):
    """A `prompt`, or `messages` rendered with the chat template (and the fields a chat completion renders them
    with, named as it names them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None  # default: on for a prompt, off for messages (the template writes them)
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _prompt_or_messages(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]
