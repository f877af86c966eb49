"""A background stream read where its turn does not run: the stored chunks replayed from any event, more polled for
while the running replica stamps the response, and the stream ended from the stored record once none does."""

import asyncio
import time

from deployments.http.responses.background_stream import follow_stored
from deployments.http.responses.store import ResponseStore
from deployments.storage import LocalStore

RESPONSE_ID = "resp_" + "1" * 32


def delta(n: int) -> dict:
    return {"type": "response.output_text.delta", "sequence_number": n}


def completed(n: int) -> dict:
    return {"type": "response.completed", "sequence_number": n, "response": {"status": "completed"}}


async def collect(events) -> list[dict]:
    return [event async for event in events]


def test_stored_events_are_read_after_any_sequence_number(tmp_path):
    store = ResponseStore(LocalStore(str(tmp_path)))

    async def main():
        await store.put_events(None, RESPONSE_ID, 0, [delta(0), delta(1), delta(2)], False)
        await store.put_events(None, RESPONSE_ID, 3, [delta(3), delta(4)], False)
        assert await store.events(None, RESPONSE_ID, 3) == ([delta(4)], False)
        await store.put_events(None, RESPONSE_ID, 5, [completed(5)], True)
        assert await store.events(None, RESPONSE_ID, -1) == ([*map(delta, range(5)), completed(5)], True)
        assert await store.events(None, RESPONSE_ID, 2) == ([delta(3), delta(4), completed(5)], True)
        assert await store.events(None, RESPONSE_ID, 5) == ([], True)
        assert await store.has_events(None, RESPONSE_ID) and not await store.has_events(None, "resp_" + "2" * 32)

    asyncio.run(main())


def test_a_stored_stream_is_polled_while_its_replica_stamps_it(tmp_path):
    store = ResponseStore(LocalStore(str(tmp_path)))

    async def main():
        await store.put_events(None, RESPONSE_ID, 0, [delta(0), delta(1)], False)
        await store.stamp(None, RESPONSE_ID, time.time())  # another replica runs it
        events = follow_stored(store, None, RESPONSE_ID, 0, record_now=None)
        assert await anext(events) == delta(1)
        rest = asyncio.create_task(collect(events))
        await store.put_events(None, RESPONSE_ID, 2, [delta(2), completed(3)], True)
        assert await rest == [delta(2), completed(3)]

    asyncio.run(main())


def test_a_stored_stream_its_replica_left_unended_ends_from_the_record(tmp_path):
    store = ResponseStore(LocalStore(str(tmp_path)))
    failed = {"status": "failed", "error": {"code": "server_error", "message": "its replica stopped"}}

    async def record_now() -> dict:
        return failed

    async def main():
        await store.put_events(None, RESPONSE_ID, 0, [delta(0), delta(1)], False)
        await store.stamp(None, RESPONSE_ID, time.time() - 3600)  # its replica's last stamp, an hour ago
        return await collect(follow_stored(store, None, RESPONSE_ID, -1, record_now))

    assert asyncio.run(main()) == [
        delta(0), delta(1),
        {"type": "error", "sequence_number": 2, "code": "server_error", "message": "its replica stopped",
         "param": None},
        {"type": "response.failed", "sequence_number": 3, "response": failed}]


def test_an_ended_stream_takes_no_more_events_and_numbers_on(tmp_path):
    """A turn still adding events after its stream was ended (the store failed under it) adds nothing."""
    from deployments.api.responses.protocol import ResponsesRequest
    from deployments.http.responses.background_stream import BackgroundStream
    from deployments.http.responses.events import ResponseEvents

    events = ResponseEvents(ResponsesRequest.model_validate({"model": "m", "input": "hi"}), RESPONSE_ID, "m")
    stream = BackgroundStream(events, ResponseStore(LocalStore(str(tmp_path))), None)
    stream.end({"status": "cancelled"})
    stream.add(events.event("response.output_text.delta", delta="late"))

    async def read() -> list[dict]:
        return await collect(stream.follow(-1))

    assert [e["type"] for e in asyncio.run(read())] == ["response.created", "response.queued", "error"]
    assert events.sequence == 4  # the late event took 3: the end's numbers are never reused


def test_a_stored_stream_whose_response_goes_midway_ends_with_an_error_event(tmp_path):
    from deployments.errors import OpenAIError

    store = ResponseStore(LocalStore(str(tmp_path)))

    async def record_now() -> dict:
        raise OpenAIError(404, "Response not found.", None, "response_not_found")

    async def main():
        await store.put_events(None, RESPONSE_ID, 0, [delta(0)], False)
        return await collect(follow_stored(store, None, RESPONSE_ID, -1, record_now))

    assert asyncio.run(main()) == [delta(0), {"type": "error", "sequence_number": 1, "code": "response_not_found",
                                              "message": "Response not found.", "param": None}]
