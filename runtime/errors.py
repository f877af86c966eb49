"""The engine's errors: bad options or input (naming the offending field), and one request's failure."""


class InvalidInputError(ValueError):
    """A request or engine option is invalid; `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message

    def __reduce__(self):  # it crosses from the engine's process (runtime.engine.engine_process)
        return type(self), (self.param, self.message)


def require(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidInputError(param, message)


class RequestFailedError(RuntimeError):
    """The engine could not go on with one request (it was finished; the engine and other requests go on)."""


def describe(e: Exception) -> str:
    """A failure in a line a client may see: its type and the start of its message."""
    return f"{type(e).__name__}: {str(e)[:200]}"
