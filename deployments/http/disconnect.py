"""A client that leaves mid-response is a disconnect, not a failed request.

Behind Serve's proxy, an app's `receive` raises Ray's TaskCancelledError once
the proxy has dropped a request whose client went away (its call for the
client's next messages is cancelled), where an ASGI server would return an
`http.disconnect` message. Raised inside a streaming response, Serve logs it
as "Request failed" with a traceback and counts an error: every client that
stops a stream early (a chat UI's stop button) would show up as one, and the
traceback costs the replica a few milliseconds of its interpreter each time.
"""

from ray.exceptions import TaskCancelledError


class DisconnectOnCancel:
    """ASGI middleware: `receive` answers `http.disconnect` where Serve's raises TaskCancelledError."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def receive_or_disconnect():
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send)
