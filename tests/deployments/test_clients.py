"""The Ray hop's retries (deployments/clients.py): a replica whose engine died (a lost tensor- or pipeline-parallel
rank) before a request returned anything is a lost replica: the request is asked once more, whole or streamed;
twice is the lost replica's 503; any other error, or an engine that dies after a stream's first chunk, is not
retried."""

import asyncio

import pytest

from deployments.clients import _LOST_MESSAGE, _reply, _stream
from deployments.errors import ENGINE_DEAD, OpenAIError, StreamError


def _dead() -> OpenAIError:
    return OpenAIError(503, "the engine died", code=ENGINE_DEAD)


def _sends(*outcomes):
    """A `send` whose calls raise or return `outcomes` in turn; the calls made."""
    calls = []

    async def send():
        calls.append(outcomes[len(calls)])
        if isinstance(calls[-1], Exception):
            raise calls[-1]
        return calls[-1]
    return send, calls


def test_a_reply_from_a_replica_whose_engine_died_is_asked_of_another():
    send, calls = _sends(_dead(), {"id": "chatcmpl-1"})
    assert asyncio.run(_reply(send)) == {"id": "chatcmpl-1"} and len(calls) == 2
    send, calls = _sends(_dead(), _dead())
    with pytest.raises(OpenAIError) as e:
        asyncio.run(_reply(send))
    assert (e.value.status, e.value.message, len(calls)) == (503, _LOST_MESSAGE, 2)
    send, calls = _sends(OpenAIError(400, "bad"), {"id": "never"})
    with pytest.raises(OpenAIError, match="bad"):
        asyncio.run(_reply(send))
    assert len(calls) == 1


class _Stream:
    """A replica's stream: its chunks, then what it raises (if anything)."""

    def __init__(self, chunks: list, error: Exception | None = None):
        self.chunks, self.error = chunks, error

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        pass


def _relay(*streams: _Stream) -> list:
    sent = iter(streams)

    async def collect():
        return [item async for item in _stream(lambda: next(sent))]
    return asyncio.run(collect())


def test_a_stream_whose_engine_died_before_its_first_chunk_is_asked_of_another_and_after_it_is_not():
    assert _relay(_Stream([], _dead()), _Stream([{"n": 1}, {"n": 2}])) == [{"n": 1}, {"n": 2}]
    with pytest.raises(OpenAIError, match="retry the request"):
        _relay(_Stream([], _dead()), _Stream([], _dead()))
    relayed = _relay(_Stream([{"n": 1}], _dead()))
    assert relayed[0] == {"n": 1} and isinstance(relayed[1], StreamError) and len(relayed) == 2
