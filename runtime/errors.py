"""The engine's errors: bad options or input (naming the offending field), and one request's failure."""


class InvalidInputError(ValueError):
    """A request or engine option is invalid; `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message

    def __reduce__(self):  # it crosses from the engine's process (runtime.engine.engine_process)
        return type(self), (self.param, self.message)


class ContextLengthError(InvalidInputError):
    """A prompt, or a prompt and its max_tokens, over the model's context: the counts, so each API can word it
    as its clients expect (Anthropic's clients read the numbers back). `max_tokens` None: the prompt alone is too
    long; `prompt_tokens` may be a lower bound (a text refused before tokenizing)."""

    def __init__(self, param: str, message: str, prompt_tokens: int, max_tokens: int | None, limit: int):
        super().__init__(param, message)
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit

    def __reduce__(self):
        return type(self), (self.param, self.message, self.prompt_tokens, self.max_tokens, self.limit)


def require(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidInputError(param, message)


class RequestFailedError(RuntimeError):
    """The engine could not go on with one request (it was finished; the engine and other requests go on)."""


def describe(e: Exception) -> str:
    """A failure in a line a client may see: its type and the start of its message."""
    return f"{type(e).__name__}: {str(e)[:200]}"
