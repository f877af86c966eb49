"""A client that stops reading is let go (deployments/http/stalled_streams.py): the guard's own logic, around a
Starlette streaming response as our routes return it, driven by ASGI calls whose `send` stops returning as a
full client socket does. Served end to end (Serve's proxy, a client that never reads): tests/reliability."""

import asyncio

from starlette.responses import StreamingResponse

from deployments.http.stalled_streams import StalledStreamGuard


def _endless_stream(state: dict) -> StreamingResponse:
    async def chunks():
        try:
            while True:
                state["made"] += 1
                yield f"data: {state['made']}\n\n"
                await asyncio.sleep(0)
        finally:  # the request's work upstream stops here (the route cancels its engine request)
            state["closed"] = True

    return StreamingResponse(chunks(), media_type="text/event-stream")


def _run(accepted_before_stall: int, seconds_per_write: float, stall_s: float, total: int | None = None) -> dict:
    """Serve one request; the client takes each write in `seconds_per_write`, and after `accepted_before_stall`
    writes none at all. Returns the stream's state and the messages the client got."""
    state = {"made": 0, "closed": False, "got": []}

    async def app(scope, receive, send):
        if total is None:
            await _endless_stream(state)(scope, receive, send)
        else:
            await StreamingResponse(iter([b"x"] * total))(scope, receive, send)

    async def receive():
        if not state.get("sent_body"):
            state["sent_body"] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never closes

    async def send(message):
        if len(state["got"]) >= accepted_before_stall:
            await asyncio.Event().wait()  # its socket is full: the write never completes
        await asyncio.sleep(seconds_per_write)
        state["got"].append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "GET", "path": "/",
             "headers": []}
    asyncio.run(asyncio.wait_for(StalledStreamGuard(app, stall_s=stall_s)(scope, receive, send), 10))
    return state


def test_a_client_that_stops_reading_is_disconnected_and_the_stream_stops():
    state = _run(accepted_before_stall=5, seconds_per_write=0, stall_s=0.2)
    assert state["closed"]  # the response generator was closed: the request upstream ends
    assert len(state["got"]) == 5  # nothing more was handed to the stalled client
    assert state["got"][0]["type"] == "http.response.start"


def test_a_slow_reader_within_the_bound_gets_the_whole_response():
    state = _run(accepted_before_stall=10**6, seconds_per_write=0.05, stall_s=0.2, total=20)
    bodies = [m for m in state["got"] if m["type"] == "http.response.body"]
    assert b"".join(m["body"] for m in bodies) == b"x" * 20 and bodies[-1]["more_body"] is False
