"""A TCP link with a fixed one-way delay each way: what a benchmark puts between a server and a local stand-in
for a remote service (an S3-compatible server on this machine reached as S3 is from a cluster).

Every byte arrives `one_way_s` after it was sent, in order, so a request and its answer take one round trip
more, however they are cut into reads; the link's bandwidth is the machine's."""

import asyncio
import threading
import time


class SlowLink:
    """Listens on `port`; each connection is forwarded to 127.0.0.1:`upstream_port` on an event loop thread."""

    def __init__(self, upstream_port: int, port: int, one_way_s: float):
        self.upstream_port, self.port, self.one_way_s = upstream_port, port, one_way_s
        self._loop = asyncio.new_event_loop()
        listening = threading.Event()
        threading.Thread(target=self._serve, args=(listening,), name="slow-link", daemon=True).start()
        listening.wait()

    def _serve(self, listening: threading.Event) -> None:
        self._loop.run_until_complete(asyncio.start_server(self._connect, "127.0.0.1", self.port))
        listening.set()
        self._loop.run_forever()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._carry(reader, up_writer), self._carry(up_reader, writer), return_exceptions=True)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Bytes read from `reader`, written to `writer` once their delay is up."""
        in_transit: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver():
            while (item := await in_transit.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        delivering = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(1 << 16):
                in_transit.put_nowait((time.monotonic() + self.one_way_s, data))
        finally:
            in_transit.put_nowait(None)
            await delivering
